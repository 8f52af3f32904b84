#!/usr/bin/env bash
# Whole-process timing of one server container's start + stop:
#   helper: `gpuq-node serve` API — POST start, POST stop (and POST wipe, which
#           a next start on the node needs) — three `curl` processes;
#   CLI:    `podman run -d` with the same image, mounts and command, then
#           `podman rm -f` — two `podman` processes;
# both against the same rootful Podman service/storage, the DAOS simulator
# image (integration/daos-sim-image) as the server. Prints medians (hyperfine)
# and how much the helper adds.
#
# Runs in a network namespace of its own (loopback only), as one test-cluster
# node would; removes everything it made on exit.
#
#   sudo integration/bench/node-start-stop.sh      # RUNS=10
set -euo pipefail
. "$(dirname "$0")/lib-stop.sh"
RUNS=${RUNS:-10}
repo=$(cd "$(dirname "$0")/../.." && pwd)
[ "$(id -u)" = 0 ] || { echo "node-start-stop.sh: run as root" >&2; exit 1; }
command -v hyperfine >/dev/null || { echo "node-start-stop.sh: needs hyperfine" >&2; exit 1; }
if [ -z "${GPUQ_BENCH_NETNS:-}" ]; then
    exec env GPUQ_BENCH_NETNS=1 unshare --net -- sh -c 'ip link set lo up && exec "$@"' sh "$0" "$@"
fi
cd "$repo"
# GPUQ_BIN_DIR: a dir with gpuq-node to use (the smoke run in tests/run
# passes the debug build); default: a release build.
if [ -z "${GPUQ_BIN_DIR:-}" ]; then
    cargo build --locked --release -p gpuq-node >&2
    NODE=$repo/target/release/gpuq-node
else
    NODE=$GPUQ_BIN_DIR/gpuq-node
fi
[ -x "$NODE" ] || { echo "node-start-stop.sh: no gpuq-node at $NODE" >&2; exit 1; }
out=$(./integration/daos-sim-image/build.sh --out "$repo/target/daos-sim-image")
image=$(echo "$out" | sed -n 's/^image: //p')
archive=$(echo "$out" | sed -n 's/^archive: //p')

tmp=$(mktemp -d /tmp/gpuq-node-bench.XXXXXX)
mkdir -p "$tmp"/{root,runroot,tmp,vartmp,jobs,test,cli}
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
svc=; node=
cleanup() {
    set +e
    [ -n "$node" ] && kill "$node" && wait "$node"
    "${P[@]}" rm --all --force --time 0 >/dev/null 2>&1
    [ -n "$svc" ] && kill "$svc" && wait "$svc"
    for _ in $(seq 30); do
        pids=$(grep -l "$tmp/" /proc/[0-9]*/cmdline 2>/dev/null | sed 's|/proc/||; s|/cmdline||')
        [ -z "$pids" ] && break
        sleep 0.1
    done
    for p in $pids; do kill -9 "$p" 2>/dev/null; done
    awk -v p="$tmp" '$5 == p || index($5, p "/") == 1 {print $5}' /proc/self/mountinfo |
        sort -r | while read -r m; do umount "$m" 2>/dev/null || umount -l "$m"; done
    rm -rf "$tmp"
}
trap cleanup EXIT

"${P[@]}" system service --time=0 "unix://$tmp/podman.sock" 2>"$tmp/podman.log" & svc=$!
for _ in $(seq 100); do [ -S "$tmp/podman.sock" ] && break; sleep 0.05; done
curl -sS --fail-with-body --unix-socket "$tmp/podman.sock" -X POST -H "Content-Type: application/x-tar" --data-binary "@$archive" \
    http://d/v4.0.0/libpod/images/load >/dev/null
cat >"$tmp/node.toml" <<TOML
[node]
name = "da1"
socket = "$tmp/node.sock"
podman_socket = "$tmp/podman.sock"
jobs_dir = "$tmp/jobs"
test_dir = "$tmp/test"

[profiles.test]
image = "$image"
daos_version = "2.8.0"
mode = "test"
port = 10001
fabric_iface = "lo"
stop_grace_secs = 10
TOML
chmod 644 "$tmp/node.toml"
"$NODE" --config "$tmp/node.toml" serve 2>"$tmp/node.log" & node=$!
for _ in $(seq 100); do [ -S "$tmp/node.sock" ] && break; sleep 0.05; done

# The CLI path gets the same config file, mounts and command as the helper's.
n() { echo "curl -sS --fail-with-body -o /dev/null --unix-socket $tmp/node.sock -X POST"; }
helper="$(n) -d '{\"profile\":\"test\",\"replicas\":[\"127.0.0.1\"]}' http://n/v1/leases/B/start && $(n) http://n/v1/leases/B/stop && $(n) http://n/v1/leases/B/wipe"
# One helper cycle first, to get the rendered config for the CLI path.
sh -c "$(n) -d '{\"profile\":\"test\",\"replicas\":[\"127.0.0.1\"]}' http://n/v1/leases/B/start"
cp "$tmp/jobs/B/daos_server.yml" "$tmp/cli/daos_server.yml"
sed -i "s|$tmp/test/B|$tmp/cli/data|g" "$tmp/cli/daos_server.yml"
sh -c "$(n) http://n/v1/leases/B/stop && $(n) http://n/v1/leases/B/wipe"
cli="rm -rf $tmp/cli/data && mkdir $tmp/cli/data && ${P[*]} run -d --name bench --network host \
 --ulimit nofile=4096:4096 --ulimit nproc=4096:4096 \
 -v $tmp/cli/daos_server.yml:/etc/daos/daos_server.yml:ro -v $tmp/cli/data:$tmp/cli/data \
 $image daos_server start -o /etc/daos/daos_server.yml >/dev/null && ${P[*]} rm -f -t 10 bench >/dev/null"

hyperfine --runs "$RUNS" --warmup 1 --export-json "$tmp/h.json" \
    -n "gpuq-node API (start, stop, wipe)" "$helper" \
    -n "podman CLI (run -d, rm -f)" "$cli" >&2
python3 - "$tmp/h.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["results"]
h, c = r[0]["median"], r[1]["median"]
print(f"\nmedian  gpuq-node API (start+stop+wipe): {h*1000:.0f} ms")
print(f"median  podman CLI (run -d + rm -f):    {c*1000:.0f} ms")
print(f"ratio {h/c:.2f}; the helper adds {(h-c)*1000:+.0f} ms (target: under +20 ms)")
PY
