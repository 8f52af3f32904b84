#!/usr/bin/env bash
# --stor nfsrdma (#18): one job's stand-up (submit → the job's command runs)
# and cleanup (its end → the lease released), gpuq against the same steps
# by hand as the original did them (from cxl2, one ssh per node: mkfs.xfs,
# mount, chown, the kernel NFS server started and its export caches primed
# by hand; then `mount -t nfs4` on cxl2; cleanup: umount, the server
# stopped, umount, blkdiscard), in the site VM — the only place here with
# a kernel NFS server and real (emulated) NVMe. Under TCG every
# instruction is emulated: the ratio is the point, not the seconds. N runs
# each (default 5), alternating; prints every run and the medians and
# ratios.
#
#   sudo integration/bench/stor-nfs.sh        # after integration/package
#
# Boots its own VM (a temporary state dir) and takes it down on exit, also
# on failure or ^C.
set -euo pipefail
N=${N:-5}
repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"
rel=$repo/target/zig/x86_64-unknown-linux-gnu/release
for b in gpuq gpuq-broker gpuq-node; do
  [ -x "$rel/$b" ] || { echo "stor-nfs.sh: no $rel/$b: run integration/package first" >&2; exit 1; }
done
tmp=$(mktemp -d /tmp/gpuq-stor-bench.XXXXXX)
cleanup() {
  [ ! -e "$tmp/state/qemu.pid" ] || bash integration/vm/site/down "$tmp/state" >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
bash integration/vm/site/build.sh target/site-vm >/dev/null
img=$(integration/daos-sim-image/build.sh --out "$repo/target/bench-daos-sim-image" 2>/dev/null)
archive=$(echo "$img" | sed -n 's/^archive: //p')
image=$(echo "$img" | sed -n 's/^image: //p')
[ -n "$image" ] || { echo "stor-nfs.sh: integration/daos-sim-image/build.sh printed no image" >&2; exit 1; }
# What the guest gets: as tests/tests/site_vm.rs stages it.
f=$tmp/files
mkdir -p "$f/integration"
for b in gpuq gpuq-broker gpuq-node; do objcopy --strip-debug "$rel/$b" "$f/$b"; done
cp systemd/gpuq-broker.service integration/vm/site/guest/*.sh "$f/"
cp -r integration/cluster "$f/integration/cluster"
cp "$archive" "$f/daos-sim-image.tar"
printf '%s' "$image" >"$f/image-id"
integration/mkfs-image/build.sh --out "$tmp/mkfs" >/dev/null
cp "$tmp/mkfs/mkfs-image.tar" "$f/mkfs-image.tar"
tr -d '\n' <"$tmp/mkfs/image-id" >"$f/mkfs-image-id"
bash integration/vm/site/up target/site-vm "$tmp/state" --files "$f" >/dev/null
bash integration/vm/site/run "$tmp/state" "SITE_SCENARIOS=stor-nfs-bench STOR_BENCH_N=$N bash /gpuq/site-physical.sh" \
  </dev/null >"$tmp/out" 2>&1 || { tail -n 40 "$tmp/out" >&2; exit 1; }
grep '^NFS-BENCH ' "$tmp/out"
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
m() { grep "^NFS-BENCH $1 " "$tmp/out" | awk -v k="$2" '{for (i=1;i<=NF;i++) if ($i==k) print $(i+1)}' | median; }
gs=$(m gpuq standup); gc=$(m gpuq cleanup); hs=$(m hand standup); hc=$(m hand cleanup)
printf 'median over %s runs (s): stand-up gpuq %s, by hand %s (ratio %s); cleanup gpuq %s, by hand %s (ratio %s)\n' \
  "$N" "$gs" "$hs" "$(awk -v a="$gs" -v b="$hs" 'BEGIN{printf "%.2f", a/b}')" \
  "$gc" "$hc" "$(awk -v a="$gc" -v b="$hc" 'BEGIN{printf "%.2f", a/b}')"
