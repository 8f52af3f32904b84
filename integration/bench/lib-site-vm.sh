# Sourced by the benchmarks that run in the site VM (stor-nvmeof.sh,
# stor-nfs.sh): boots a VM of its own (a temporary state dir, taken down
# on exit, also on failure or ^C) with the release binaries staged as
# tests/tests/site_vm.rs stages them, runs site-physical.sh in one of its
# bench modes, prints the guest's "TAG gpuq|hand RUN standup S cleanup S"
# lines, then the medians and the ratios gpuq / by hand. Under TCG every
# instruction is emulated: the ratio is the point, not the seconds.
#
#   site_vm_bench NAME MODE TAG      (N runs each, default 5)

site_vm_bench() {
  local name=$1 mode=$2 tag=$3
  N=${N:-5}
  repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  cd "$repo"
  local rel=$repo/target/zig/x86_64-unknown-linux-gnu/release b
  for b in gpuq gpuq-broker gpuq-node; do
    [ -x "$rel/$b" ] || { echo "$name: no $rel/$b: run integration/package first" >&2; exit 1; }
  done
  tmp=$(mktemp -d /tmp/gpuq-stor-bench.XXXXXX)
  trap '[ ! -e "$tmp/state/qemu.pid" ] || bash integration/vm/site/down "$tmp/state" >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
  trap 'exit 130' INT TERM
  bash integration/vm/site/build.sh target/site-vm >/dev/null
  local img archive image f
  img=$(integration/daos-sim-image/build.sh --out "$repo/target/bench-daos-sim-image" 2>/dev/null)
  archive=$(echo "$img" | sed -n 's/^archive: //p')
  image=$(echo "$img" | sed -n 's/^image: //p')
  [ -n "$image" ] || { echo "$name: integration/daos-sim-image/build.sh printed no image" >&2; exit 1; }
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
  bash integration/vm/site/run "$tmp/state" "SITE_SCENARIOS=$mode STOR_BENCH_N=$N bash /gpuq/site-physical.sh" \
    </dev/null >"$tmp/out" 2>&1 || { tail -n 40 "$tmp/out" >&2; exit 1; }
  grep "^$tag " "$tmp/out"
  median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
  m() { grep "^$tag $1 " "$tmp/out" | awk -v k="$2" '{for (i=1;i<=NF;i++) if ($i==k) print $(i+1)}' | median; }
  local gs gc hs hc
  gs=$(m gpuq standup); gc=$(m gpuq cleanup); hs=$(m hand standup); hc=$(m hand cleanup)
  printf 'median over %s runs (s): stand-up gpuq %s, by hand %s (ratio %s); cleanup gpuq %s, by hand %s (ratio %s)\n' \
    "$N" "$gs" "$hs" "$(awk -v a="$gs" -v b="$hs" 'BEGIN{printf "%.2f", a/b}')" \
    "$gc" "$hc" "$(awk -v a="$gc" -v b="$hc" 'BEGIN{printf "%.2f", a/b}')"
}
