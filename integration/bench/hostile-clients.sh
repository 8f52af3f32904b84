#!/usr/bin/env bash
# One user against the broker (issue 13, item 7), as root:
#   a broker (release build, direct runner, no GPU, the default [broker]
#   limits) running a job of uid 61001 that prints ten lines a second;
#   then N (1,000) connections at once from uid 61001 — idle, slow heads,
#   lists, submits and follows, each opened again when the broker closes it
#   (hostile_clients.py) — while uid 61002 runs `gpuq list` SAMPLES times:
#   its p50/p99 (whole process, as a user sees it) before and under the
#   flood, the broker's RSS, the connections the broker holds, and whether
#   61002's submit still succeeds. Target: p99 of that list under 50 ms.
#
#   ./integration/bench/hostile-clients.sh     (env: N=1000 SAMPLES=300 GPUQ_BIN_DIR=...)
set -euo pipefail
. "$(dirname "$0")/lib-stop.sh"
cd "$(dirname "$0")/../.."
[ "$(id -u)" = 0 ] || { echo "hostile-clients.sh: run as root" >&2; exit 1; }
PY=/usr/bin/python3   # not a per-user shim: the other uids run it too
[ -x "$PY" ] || { echo "hostile-clients.sh: needs /usr/bin/python3" >&2; exit 1; }
N=${N:-1000}; SAMPLES=${SAMPLES:-300}
if [ -z "${GPUQ_BIN_DIR:-}" ]; then
  cargo build --locked --release --bins -p gpuq-broker -p gpuq-cli >&2
  GPUQ_BIN_DIR=$PWD/target/release
fi
BIN=$GPUQ_BIN_DIR
cg2=$(awk '$3 == "cgroup2" { print $2; exit }' /proc/self/mounts)
B=$(mktemp -d /tmp/gpuq-hostile.XXXXXX); chmod 755 "$B"
CG="$cg2/gpuq-hostile-$$"
PID=; SWARM=
cleanup() {
  set +e
  [ -n "$SWARM" ] && kill "$SWARM" 2>/dev/null && wait "$SWARM" 2>/dev/null
  [ -n "$PID" ] && kill "$PID" 2>/dev/null && wait "$PID" 2>/dev/null
  for d in "$CG"/gpuq-job-*; do [ -d "$d" ] && { echo 1 > "$d/cgroup.kill"; sleep 0.2; rmdir "$d"; }; done
  [ -d "$CG" ] && rmdir "$CG"
  rm -rf "$B"
}
trap cleanup EXIT
cp integration/bench/hostile_clients.py "$B/"; chmod 644 "$B/hostile_clients.py"
cat > "$B/broker.toml" <<TOML
[broker]
socket = "$B/broker.sock"
state_dir = "$B/state"
log_root = "$B/logs"
maintenance_file = "$B/maintenance.json"
runner = "direct"
cgroup_parent = "$CG"
gpu = "none"
TOML
"$BIN/gpuq-broker" --config "$B/broker.toml" 2>> "$B/broker.log" & PID=$!
for _ in $(seq 200); do [ -S "$B/broker.sock" ] && GPUQ_SOCKET=$B/broker.sock "$BIN/gpuq" list >/dev/null 2>&1 && break; sleep 0.05; done
export GPUQ_SOCKET=$B/broker.sock
as() { local u=$1; shift; setpriv --reuid="$u" --regid="$u" --clear-groups "$@"; }
mkdir -p "$B/w1" "$B/w2"; chown 61001:61001 "$B/w1"; chown 61002:61002 "$B/w2"
JOB=$(cd "$B/w1" && as 61001 "$BIN/gpuq" submit --time 30m -- bash -c 'while :; do echo tick; sleep 0.1; done')
for _ in $(seq 100); do as 61001 "$BIN/gpuq" status "$JOB" 2>/dev/null | grep -q running && break; sleep 0.1; done
rss() { awk '/^VmRSS/ {printf "%.1f", $2/1024}' /proc/$PID/status; }
hwm() { awk '/^VmHWM/ {printf "%.1f", $2/1024}' /proc/$PID/status; }
echo "load before: $(cat /proc/loadavg); cpu pressure: $(head -1 /proc/pressure/cpu 2>/dev/null)"
echo "broker RSS before: $(rss) MiB"
echo "== uid 61002: gpuq list x$SAMPLES, no flood"
quiet=$(cd "$B/w2" && as 61002 "$PY" "$B/hostile_clients.py" measure "$BIN/gpuq" "$SAMPLES")
echo "$quiet"
echo "== uid 61001: $N connections for $(( SAMPLES / 20 + 30 ))s"
(cd "$B/w1" && as 61001 "$PY" "$B/hostile_clients.py" swarm "$B/broker.sock" "$JOB" "$N" $(( SAMPLES / 20 + 30 )) > "$B/swarm.json") & SWARM=$!
sleep 8
"$PY" "$B/hostile_clients.py" stats "$B/broker.sock" > "$B/stats1.json"
echo "broker under the flood: $(cat "$B/stats1.json")"
cpu() { awk '{ printf "%.2f", ($14 + $15) / 100 }' /proc/$PID/stat; }   # CPU seconds (USER_HZ 100)
cpu0=$(cpu); t0=$(date +%s.%N)
echo "== uid 61002: gpuq list x$SAMPLES under the flood"
flood=$(cd "$B/w2" && as 61002 "$PY" "$B/hostile_clients.py" measure "$BIN/gpuq" "$SAMPLES")
echo "$flood"
submit=$(cd "$B/w2" && as 61002 "$BIN/gpuq" submit -- true 2>&1) && ok=yes || ok="NO: $submit"
echo "uid 61002's submit under the flood: $ok (job $submit)"
rss_flood=$(rss)
echo "broker CPU during the measurement: $("$PY" -c "import sys; print(round((float(sys.argv[1]) - float(sys.argv[2])) / (float(sys.argv[3]) - float(sys.argv[4])), 2))" "$(cpu)" "$cpu0" "$(date +%s.%N)" "$t0") cores"
"$PY" "$B/hostile_clients.py" stats "$B/broker.sock" > "$B/stats2.json"
wait "$SWARM"; SWARM=
echo "what the hostile clients saw: $(cat "$B/swarm.json")"
echo "load after: $(cat /proc/loadavg)"
"$PY" - "$quiet" "$flood" "$rss_flood" "$(hwm)" "$ok" "$B/stats2.json" "$N" <<'PY'
import json, sys
q, f = json.loads(sys.argv[1]), json.loads(sys.argv[2])
s = json.load(open(sys.argv[6]))
print("\nresult                                      p50        p99        max")
print(f"uid 61002 gpuq list, no flood              {q['p50_ms']:<10} {q['p99_ms']:<10} {q['max_ms']} ms  ({q['failed']} failed)")
print(f"uid 61002 gpuq list, {sys.argv[7]} hostile conns    {f['p50_ms']:<10} {f['p99_ms']:<10} {f['max_ms']} ms  ({f['failed']} failed)   target p99 < 50 ms")
print(f"broker RSS under the flood / peak          {sys.argv[3]} / {sys.argv[4]} MiB")
print(f"connections the broker held (all but root) {s['connections']['others']}, per uid {s['connections']['per_uid']}")
print(f"uid 61002 submit under the flood           {sys.argv[5]}")
PY
