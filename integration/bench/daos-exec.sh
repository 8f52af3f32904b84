#!/usr/bin/env bash
# `gpuq daos-exec -- true` against Podman's own `podman run --rm IMAGE true`,
# whole processes, on the local five-host test cluster (docs/test-cluster.md)
# and the SAME Podman service: cxl2's, the one the broker makes client
# containers on. Target (issue 7): daos-exec's median at most 1.2× Podman's.
#
# daos-exec works only inside a running `--inst` job, so the timing runs in
# one: the script brings up a cluster and a broker in cxl2's network
# namespace (as tests/src/daos_site.rs does), submits as root an
# `--inst test` job whose script times, one after the other,
#   exec          gpuq daos-exec -- true
#   exec+rm       the same, then polling cxl2's Podman (curl, label
#                 io.gpuq.role=client) until the client container is gone:
#                 the CLI exits as soon as the exit code arrives and the
#                 broker removes the container after that, while
#                 `podman run --rm` returns only once it is removed
#   podman        podman --remote --url unix://<cxl2's podman.sock> run --rm IMAGE true
#   podman-same   the same, with the client container's settings: --network host,
#                 --user 0:0, --cap-drop ALL, no-new-privileges, the submit dir,
#                 agent dir and control config (ro) at the same paths, a tmpfs /tmp
# (hyperfine -N, 2 warm-up runs, N runs each, JSON into the job's
# directory; without hyperfine a loop with `date +%s%N`), and prints the
# medians and the ratios. Every run of `exec` is a whole client container:
# checks, create, start, exec session, stream, exit code (the removal
# follows the CLI's exit).
#
# Brings up its own cluster (own dir and namespace prefix) and removes it,
# the broker and everything else it made on exit, also on failure or ^C.
# Nothing is sent to 10.200.0.0/24 from the root namespace: the broker and
# its job live in cxl2's namespace; Podman is reached by its unix socket.
#
#   sudo integration/bench/daos-exec.sh            # N=20
#   sudo N=50 KEEP=/tmp/dx integration/bench/daos-exec.sh
# Env: N (runs per command); LOOP=1 uses the shell loop even where
# hyperfine is installed; KEEP=DIR copies the raw results (hyperfine's
# JSON or the loop's times) there; GPUQ_BIN_DIR (gpuq, gpuq-broker,
# gpuq-node; default: `cargo build --release` into target/release). The
# binaries are copied first, so a concurrent rebuild cannot change them
# mid-run.
set -euo pipefail
. "$(dirname "$0")/lib-stop.sh"
N=${N:-20}
repo=$(cd "$(dirname "$0")/../.." && pwd)
me=daos-exec.sh
. "$repo/integration/bench/lib-daos.sh"
daos_preflight
command -v podman >/dev/null || { echo "$me: needs podman" >&2; exit 1; }
cd "$repo"
if [ -z "${GPUQ_BIN_DIR:-}" ]; then
    cargo build --locked --release --bins -p gpuq-broker -p gpuq-cli -p gpuq-node >&2
    SRC=$repo/target/release
else
    SRC=$GPUQ_BIN_DIR
fi
daos_check_bins "$SRC"
daos_build_image

# Our own everything (lib-daos.sh): B also holds the binaries and the job's
# directory B/w.
daos_make_dirs dx
daos_cgroup "gpuq-bench-dx-$$"
daos_traps

mkdir -p "$B/bin" "$B/w"
for b in gpuq gpuq-broker gpuq-node; do cp "$SRC/$b" "$B/bin/$b"; done
BIN=$B/bin

t_up=$EPOCHREALTIME
daos_cluster_up
PSOCK=$D/cxl2/run/podman.sock
daos_write_broker_toml
daos_start_broker
echo "== cluster and broker up in $(awk -v a="$t_up" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.0f", b - a }') s" >&2

# The job's script: runs as root in B/w, inside the job (its cgroup, cxl2's
# network namespace, the DAOS environment).
cat >"$B/w/job.sh" <<EOF
set -u
export GPUQ_SOCKET=\${GPUQ_SOCKET:-$GPUQ_SOCKET}
EXEC="$BIN/gpuq daos-exec -- true"
PODMAN="podman --remote --url unix://$PSOCK run --rm $image true"
SAME="podman --remote --url unix://$PSOCK run --rm --network host --user 0:0 --cap-drop ALL --security-opt no-new-privileges -v \$PWD:\$PWD -v \$DAOS_AGENT_DRPC_DIR:\$DAOS_AGENT_DRPC_DIR -v \$DAOS_CONTROL_CONFIG:\$DAOS_CONTROL_CONFIG:ro --tmpfs /tmp:mode=1777 $image true"
cat >gone.sh <<'GONE'
$BIN/gpuq daos-exec -- true || exit
until [ "\$(curl -sS --unix-socket $PSOCK 'http://d/v4.0.0/libpod/containers/json?all=true&filters=%7B%22label%22%3A%5B%22io.gpuq.role%3Dclient%22%5D%7D')" = "[]" ]; do :; done
GONE
GONE="bash gone.sh"
# Each must work once before it is timed.
for c in "\$EXEC" "\$GONE" "\$PODMAN" "\$SAME"; do
    \$c </dev/null || { echo "bench: \$c failed (\$?)" >&2; exit 10; }
done
if [ -z "${LOOP:-}" ] && command -v hyperfine >/dev/null; then
    hyperfine -N --warmup 2 --runs $N --export-json bench.json \\
        -n exec "\$EXEC" -n exec+rm "\$GONE" -n podman "\$PODMAN" -n podman-same "\$SAME" || exit 11
else
    for name in exec exec+rm podman podman-same; do
        case \$name in exec) c=\$EXEC ;; exec+rm) c=\$GONE ;; podman) c=\$PODMAN ;; *) c=\$SAME ;; esac
        for i in \$(seq \$((2 + $N))); do
            t0=\$(date +%s%N); \$c </dev/null >/dev/null 2>&1 || exit 12; t1=\$(date +%s%N)
            [ \$i -gt 2 ] && echo "\$name \$(( (t1 - t0) / 1000 ))" >>times.txt
        done
    done
fi
EOF

cd "$B/w"
id=$("$BIN/gpuq" submit --inst test --time 20m -- bash job.sh)
echo "== job $id submitted; timing $N runs of each command inside it" >&2
daos_wait_job "$id" 0.5
[ "$st" = completed ] || { echo "$me: job $id ended $st:" >&2; "$BIN/gpuq" log "$id" >&2; exit 1; }
[ -e "$B/state/active.json" ] && { echo "$me: job $id: lease not released after 30 s" >&2; exit 1; }
left=$(curl -sS --unix-socket "$PSOCK" 'http://d/v4.0.0/libpod/containers/json?all=true')
[ "$left" = "[]" ] || { echo "$me: containers left on cxl2: $left" >&2; exit 1; }
if [ -n "${KEEP:-}" ]; then
    mkdir -p "$KEEP"
    cp bench.json times.txt "$KEEP"/ 2>/dev/null || true
    "$BIN/gpuq" log "$id" >"$KEEP/job.log"
fi

echo
echo "machine: $(nproc) cores, $(uname -r), $(podman --version), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "date:    $(date -u '+%Y-%m-%d %H:%M UTC'); binaries: $SRC; image $image"
python3 - "$B/w" "$N" <<'PY'
import json, os, statistics as st, sys
w, n = sys.argv[1], int(sys.argv[2])
times = {}
if os.path.exists(f"{w}/bench.json"):
    how = "hyperfine -N, 2 warm-up runs"
    for r in json.load(open(f"{w}/bench.json"))["results"]:
        times[r["command"]] = [t * 1000 for t in r["times"]]
else:
    how = "shell loop with date +%s%N, 2 warm-up runs"
    for line in open(f"{w}/times.txt"):
        name, us = line.split()
        times.setdefault(name, []).append(int(us) / 1000)
print(f"{n} runs each ({how}), whole-process wall time in ms\n")
print(f"{'command':<14}{'median':>9}{'mean':>9}{'min':>9}{'max':>9}")
med = {}
for name in ("exec", "exec+rm", "podman", "podman-same"):
    t = times[name]
    med[name] = st.median(t)
    print(f"{name:<14}{med[name]:9.1f}{st.mean(t):9.1f}{min(t):9.1f}{max(t):9.1f}")
r = med["exec"] / med["podman"]
print(f"\nratio exec / podman       {r:.2f}  (target: at most 1.20: {'met' if r <= 1.2 else 'NOT met'})")
print(f"ratio exec / podman-same  {med['exec'] / med['podman-same']:.2f}")
print(f"ratio exec+rm / podman    {med['exec+rm'] / med['podman']:.2f}")
PY
echo "== total $(awk -v a="$t_up" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.0f", b - a }') s (cluster up to results)" >&2
