#!/usr/bin/env bash
# --stor nvmeof (#18): one job's stand-up (submit → the job's command runs)
# and cleanup (its end → the lease released), gpuq against the same steps
# by hand as the original did them (from cxl2, one ssh per node: configfs
# by a shell, the connect written to /dev/nvme-fabrics, chown, then
# delete_controller, configfs removed, blkdiscard), in the site VM — the
# only place here with a kernel NVMe target and real (emulated) NVMe. N
# runs each (default 5), alternating; prints every run and the medians
# and ratios (lib-site-vm.sh).
#
#   sudo integration/bench/stor-nvmeof.sh        # after integration/package
#
# Boots its own VM (a temporary state dir) and takes it down on exit, also
# on failure or ^C.
set -euo pipefail
. "$(dirname "$0")/lib-stop.sh"
. "$(dirname "$0")/lib-site-vm.sh"
site_vm_bench stor-nvmeof.sh stor-bench STOR-BENCH
