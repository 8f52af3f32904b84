#!/usr/bin/env bash
# Whole-process timing of one container lifecycle (create + start + stop +
# remove) through gpuq-podman's client (examples/start_stop.rs: one process,
# connect + ping + image inspect + create + start + stop + delete) vs the
# podman CLI (`podman run -d` then `podman rm -f`, two processes), against the
# same rootful podman storage. Prints the median of RUNS runs of each.
#
# Needs root, podman, runc, busybox-static. Uses its own --root/--runroot/
# --tmpdir under a temp dir and the containers.conf from
# shared/testing/environment.md; removes everything it made on exit.
#
#   sudo integration/bench/podman-start-stop.sh            # RUNS=11
#   RUNS=21 integration/bench/podman-start-stop.sh
set -euo pipefail
. "$(dirname "$0")/lib-stop.sh"

RUNS=${RUNS:-11}
repo=$(cd "$(dirname "$0")/../.." && pwd)
target=${CARGO_TARGET_DIR:-$repo/target}

tmp=$(mktemp -d /tmp/gpuq-podman-bench.XXXXXX)
mkdir -p "$tmp"/{root,runroot,tmp,vartmp,rootfs/bin}
cat >"$tmp/containers.conf" <<'CONF'
[containers]
default_ulimits = ["nofile=4096:4096", "nproc=4096:4096"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
CONF
export CONTAINERS_CONF=$tmp/containers.conf TMPDIR=$tmp/vartmp
P=(podman --root "$tmp/root" --runroot "$tmp/runroot" --tmpdir "$tmp/tmp")
svc_pid=

our_pids() {
    local f
    for f in /proc/[0-9]*/cmdline; do
        [[ $(tr '\0' ' ' <"$f" 2>/dev/null) == *"$tmp/"* ]] && { f=${f#/proc/}; echo "${f%/cmdline}"; }
    done
    return 0
}

cleanup() {
    "${P[@]}" rm --all --force --time 0 >/dev/null 2>&1 || true
    if [[ -n $svc_pid ]]; then
        kill "$svc_pid" 2>/dev/null || true
        wait "$svc_pid" 2>/dev/null || true
    fi
    # conmon processes and their `podman container cleanup` exit commands
    # name our unique dir: let them finish, then kill stragglers by PID.
    for _ in $(seq 30); do
        ours_pids=$(our_pids)
        [[ -z $ours_pids ]] && break
        sleep 0.1
    done
    for p in $(our_pids); do kill -9 "$p" 2>/dev/null || true; done
    # Unmount what containers/storage left under our dir, deepest first.
    awk -v p="$tmp" '$5 == p || index($5, p "/") == 1 {print $5}' /proc/self/mountinfo |
        sort -r | while read -r m; do umount "$m" 2>/dev/null || umount -l "$m"; done
    rm -rf "$tmp"
}
trap cleanup EXIT

# START_STOP_BIN: the example binary to use (the smoke run in tests/run
# passes the debug build); default: a release build.
if [ -z "${START_STOP_BIN:-}" ]; then
    cargo build --quiet --release -p gpuq-podman --example start_stop --manifest-path "$repo/Cargo.toml"
    bin=$target/release/examples/start_stop
else
    bin=$START_STOP_BIN
fi
[ -x "$bin" ] || { echo "podman-start-stop.sh: no start_stop example at $bin" >&2; exit 1; }

cp /bin/busybox "$tmp/rootfs/bin/"
for a in sh sleep; do ln -s busybox "$tmp/rootfs/bin/$a"; done
tar -C "$tmp/rootfs" -cf "$tmp/rootfs.tar" .
image=$("${P[@]}" import --quiet "$tmp/rootfs.tar" localhost/gpuq-bench:latest)
[[ $image == sha256:* ]] || image=sha256:$image

sock=$tmp/podman.sock
"${P[@]}" system service --time=0 "unix://$sock" 2>"$tmp/service.log" &
svc_pid=$!
for _ in $(seq 200); do [[ -S $sock ]] && break; sleep 0.05; done
[[ -S $sock ]] || { cat "$tmp/service.log"; exit 1; }

ms() { echo $(( $(date +%s%N) / 1000000 )); }
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

ours=() cli=()
for i in $(seq "$RUNS"); do
    t0=$(ms)
    "$bin" "$sock" "$image" "bench-lib-$i" >>"$tmp/steps.txt"
    ours+=($(( $(ms) - t0 )))

    t0=$(ms)
    "${P[@]}" run -d --quiet --name "bench-cli-$i" --network host "$image" \
        sh -c "trap 'exit 0' TERM; sleep 1000 & wait" >/dev/null
    "${P[@]}" rm -f "bench-cli-$i" >/dev/null
    cli+=($(( $(ms) - t0 )))
done

m_ours=$(printf '%s\n' "${ours[@]}" | median)
m_cli=$(printf '%s\n' "${cli[@]}" | median)
echo "runs:                                  $RUNS"
echo "gpuq-podman (create+start+stop+delete): median ${m_ours} ms  (all: ${ours[*]})"
echo "podman CLI (run -d + rm -f):            median ${m_cli} ms  (all: ${cli[*]})"
echo "gpuq-podman steps (cumulative ms, last run): $(tail -1 "$tmp/steps.txt")"
awk -v a="$m_ours" -v b="$m_cli" 'BEGIN {printf "ratio ours/cli:                         %.2f\n", a / b}'
