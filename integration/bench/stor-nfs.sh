#!/usr/bin/env bash
# --stor nfsrdma (#18): one job's stand-up (submit → the job's command runs)
# and cleanup (its end → the lease released), gpuq against the same steps
# by hand as the original did them (from cxl2, one ssh per node: mkfs.xfs,
# mount, chown, the kernel NFS server started and its export caches primed
# by hand; then `mount -t nfs4` on cxl2; cleanup: umount, the server
# stopped, umount, blkdiscard), in the site VM — the only place here with
# a kernel NFS server and real (emulated) NVMe. N runs each (default 5),
# alternating; prints every run and the medians and ratios
# (lib-site-vm.sh).
#
#   sudo integration/bench/stor-nfs.sh        # after integration/package
#
# Boots its own VM (a temporary state dir) and takes it down on exit, also
# on failure or ^C.
set -euo pipefail
. "$(dirname "$0")/lib-stop.sh"
. "$(dirname "$0")/lib-site-vm.sh"
site_vm_bench stor-nfs.sh stor-nfs-bench NFS-BENCH
