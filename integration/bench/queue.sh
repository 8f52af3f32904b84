#!/usr/bin/env bash
# Queue-core benchmark (whole processes, medians), as root:
#   - `gpuq list` and `gpuq list --all` with 10,000 finished jobs in the store
#   - 1,000 sequential `gpuq submit` (queued behind a running job)
#   - the broker's resident memory afterwards
# Targets (issue 2): list < 20 ms, submit < 5 ms each, broker RSS < 30 MiB.
#
#   ./integration/bench/queue.sh        (needs hyperfine and python3)
set -euo pipefail
. "$(dirname "$0")/lib-stop.sh"
cd "$(dirname "$0")/../.."
[ "$(id -u)" = 0 ] || { echo "queue.sh: run as root" >&2; exit 1; }
command -v hyperfine >/dev/null || { echo "queue.sh: needs hyperfine (apt-get install hyperfine)" >&2; exit 1; }

cargo build --locked --release --bins -p gpuq-broker -p gpuq-cli >&2
BIN=$PWD/target/release
cg2=$(awk '$3 == "cgroup2" { print $2; exit }' /proc/self/mounts)
B=$(mktemp -d /tmp/gpuq-bench.XXXXXX); chmod 755 "$B"
CG="$cg2/gpuq-bench-$$"
PID=
cleanup() {
  set +e
  [ -n "$PID" ] && kill "$PID" 2>/dev/null && wait "$PID" 2>/dev/null
  for d in "$CG"/gpuq-job-*; do [ -d "$d" ] && { echo 1 > "$d/cgroup.kill"; sleep 0.2; rmdir "$d"; }; done
  [ -d "$CG" ] && rmdir "$CG"
  rm -rf "$B"
}
trap cleanup EXIT
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
start() {
  "$BIN/gpuq-broker" --config "$B/broker.toml" 2>> "$B/broker.log" & PID=$!
  for _ in $(seq 200); do [ -S "$B/broker.sock" ] && GPUQ_SOCKET=$B/broker.sock "$BIN/gpuq" list >/dev/null 2>&1 && return; sleep 0.05; done
  echo "broker did not start" >&2; cat "$B/broker.log" >&2; exit 1
}
stop() { kill "$PID"; wait "$PID" 2>/dev/null || true; PID=; }

start; stop   # creates the store's schema
python3 - "$B/state/queue.db" <<'PY'
import sqlite3, sys, json
db = sqlite3.connect(sys.argv[1])
rows = [(1000 + i % 7, 1000 + i % 7, "[]", f"user{i % 7}", json.dumps(["python", "train.py", f"--seed={i}"]),
         "/home/x", "[]", None, None, None, 3600, "completed", 1_790_000_000 + i, 1_790_000_000 + i,
         1_790_000_100 + i, 0, None, None, f"/logs/{i}.log") for i in range(10_000)]
db.executemany("""INSERT INTO jobs (uid, gid, groups, user, argv, cwd, env, name, inst, stor, time_limit, state,
    submitted_at, started_at, ended_at, exit_code, signal, reason, log_path)
    VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)""", rows)
db.commit()
PY
start
export GPUQ_SOCKET=$B/broker.sock
rss() { awk '/^VmRSS/ {printf "%.1f MiB", $2/1024}' /proc/$PID/status; }
echo "broker RSS after start with 10k jobs: $(rss)"
echo "== gpuq list (10,000 finished jobs in the store)"
hyperfine -N --warmup 5 --runs 50 --export-json "$B/list.json" "$BIN/gpuq list" "$BIN/gpuq list --all" >&2
echo "broker RSS after the list runs: $(rss)"
W=$B/w; mkdir -p "$W"; cd "$W"
"$BIN/gpuq" submit -- sleep 600 >/dev/null 2>&1   # keeps the gate busy: the submits below stay queued
echo "== 1,000 sequential gpuq submit"
hyperfine -N --warmup 3 --runs 1000 --export-json "$B/submit.json" "$BIN/gpuq submit -- true" >&2
rss=$(awk '/^VmRSS/ {print $2}' /proc/$PID/status); hwm=$(awk '/^VmHWM/ {print $2}' /proc/$PID/status)
python3 - "$B/list.json" "$B/submit.json" "$rss" "$hwm" <<'PY'
import json, sys
l = json.load(open(sys.argv[1]))["results"]; s = json.load(open(sys.argv[2]))["results"][0]
ms = lambda x: f"{x * 1000:.2f} ms"
print("\nresult                              median      mean        target")
print(f"gpuq list (10k finished in store)   {ms(l[0]['median']):<11} {ms(l[0]['mean']):<11} < 20 ms")
print(f"gpuq list --all (10k rows)          {ms(l[1]['median']):<11} {ms(l[1]['mean']):<11} -")
print(f"gpuq submit (1,000 sequential)      {ms(s['median']):<11} {ms(s['mean']):<11} < 5 ms")
print(f"broker RSS at the end / peak        {int(sys.argv[3])/1024:.1f} / {int(sys.argv[4])/1024:.1f} MiB        < 30 MiB")
PY
