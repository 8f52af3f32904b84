#!/usr/bin/env bash
# A whole DAOS job's lifecycle through gpuq, on the local five-host test
# cluster (docs/test-cluster.md), timed per job:
#   `gpuq submit --inst test -- true` → lease → preflight and start of the
#   four simulator servers (in parallel, through each node's gpuq-node over
#   the broker's SSH forwards) → format, join poll, agent (cxl2's Podman) →
#   the job → cleanup (agent, `dmg system stop`, servers, wipe) → release.
# N jobs one after another (default 5); prints each job's timings and the
# medians of:
#   total     submit → lease released (the broker's `released` log line)
#   sim       the DAOS simulator's own deliberate waits on the critical path
#             (crates/daos-sim; see docs/benchmarks.md):
#             - join retries: a server that formats before the management
#               service sleeps 200 ms per try (server.rs join_loop) —
#               measured from the servers' own logs as the time from the
#               end of the format step until the last rank joined, if later;
#             - SIGTERM: daos_server and daos_agent look at their signal flag
#               every 50 ms — counted at that bound, once for the agent and
#               once for the four servers (stopped in parallel);
#   overhead  total − sim: what gpuq itself costs.
# Also per step (the broker's own log lines).
# Compare with integration/bench/daos-lifecycle-sequential.sh (the same
# lifecycle by `ssh` + the `podman` CLI, one node after another).
#
# Brings up its own cluster (own dir and namespace prefix) and removes it,
# the broker and everything else it made on exit, also on failure or ^C.
#
#   sudo integration/bench/daos-lifecycle.sh          # N=5
#   sudo N=10 integration/bench/daos-lifecycle.sh
# Env: N, GAP (seconds between a job's release and the next submit; default
# 0), GPUQ_BIN_DIR (default target/debug: gpuq, gpuq-broker, gpuq-node;
# an absolute path), KEEP=DIR (keep the logs), GPUQ_LOG / GPUQ_NODE_LOG
# (e.g. info,gpuq_podman=debug: one line per Podman call with its time),
# PERF_CPU=1 (with perf installed: sample every CPU while the jobs run and
# print who used how much CPU per job; PERF_FREQ samples/s, default 499).
set -euo pipefail
. "$(dirname "$0")/lib-stop.sh"
N=${N:-5}
GAP=${GAP:-0}
export PERF_FREQ=${PERF_FREQ:-499} PERF_T1=
perf_pid=
repo=$(cd "$(dirname "$0")/../.." && pwd)
me=daos-lifecycle.sh
. "$repo/integration/bench/lib-daos.sh"
daos_preflight
BIN=${GPUQ_BIN_DIR:-$repo/target/debug}
daos_check_bins "$BIN"
cd "$repo"
daos_build_image

# Our own everything (lib-daos.sh): the broker's files, the simulator's
# logs, the cluster dir B/c.
daos_make_dirs bl
daos_cgroup "gpuq-bench-$$"
daos_traps

daos_cluster_up
daos_write_broker_toml
daos_start_broker
# Its four SSH links come up in the background; the first job would wait.
for _ in $(seq 300); do
    [ "$(grep -c 'node link up' "$B/broker.log")" -ge 4 ] && break
    sleep 0.05
done

daos_watch_logs

mkdir -p "$B/w"
cd "$B/w"
: >"$B/runs.tsv"
# PERF_CPU=1: sample every CPU while the jobs run (ours: ended by PID).
if [ -n "${PERF_CPU:-}" ]; then
    command -v perf >/dev/null || { echo "$me: PERF_CPU needs perf (apt-get install linux-perf)" >&2; exit 1; }
    perf record -q -a -e cpu-clock -F "$PERF_FREQ" -o "$B/perf.data" >"$B/perf.log" 2>&1 &
    perf_pid=$!
    sleep 0.5
fi
for i in $(seq "$N"); do
    # GAP: a queue is rarely back to back; the next lease's keys are made
    # during a job and the time after it (docs/benchmarks.md, pass J).
    [ "$i" = 1 ] || sleep "$GAP"
    t0=$EPOCHREALTIME
    id=$("$BIN/gpuq" submit --inst test -- true 2>/dev/null)
    # Until the job has ended and the lease is released (active.json gone).
    daos_wait_job "$id" 0.2
    [ -e "$B/state/active.json" ] && { echo "$me: job $id: lease not released after 30 s" >&2; exit 1; }
    [ "$st" = completed ] || { echo "$me: job $id ended $st:" >&2; "$BIN/gpuq" log "$id" >&2; exit 1; }
    daos_ctrlogs_done "$id"
    printf '%s\t%s\n' "$id" "$t0" >>"$B/runs.tsv"
    echo "job $id done" >&2
done
if [ -n "${PERF_CPU:-}" ]; then
    PERF_T1=$EPOCHREALTIME
    kill -INT "$perf_pid"
    wait "$perf_pid" || true
    perf_pid=
    perf script -i "$B/perf.data" -F comm,pid,time 2>/dev/null >"$B/perf.txt"
fi

python3 - "$B" "$repo/integration/bench" <<'PY'
import glob, re, sys
B = sys.argv[1]
sys.dont_write_bytecode = True  # nothing left in the tree
sys.path.insert(0, sys.argv[2])
from daos_times import POLL, report, ts
ansi = re.compile(r"\x1b\[[0-9;]*m")
blog = [ansi.sub("", l) for l in open(f"{B}/broker.log")]
# Each step ends at its log line; the first starts when the lease is created.
STEPS = [("preflight", "preflight passed"), ("certificates", "certificates:"),
         ("servers", "servers started"), ("format", "format:"),
         ("join", "join:"), ("agent", "agent:"), ("run", "ended job="),
         ("stop_agent", "cleanup stop_agent"), ("system_stop", "cleanup system_stop"),
         ("stop_servers", "cleanup stop_servers"), ("wipe", "cleanup wipe"), ("release", " released")]
SETUP, CLEANUP = STEPS[:5], STEPS[6:]
rows = []
for line in open(f"{B}/runs.tsv"):
    job, t0 = line.split(); t0 = float(t0)
    # Jobs run one at a time: this job's lines go from its `queued` line to
    # its lease's release (the step lines name neither job nor lease).
    mine = blog[next(i for i, l in enumerate(blog) if re.search(rf"queued job={job}(\s|$)", l)):]
    mine = mine[:next(i for i, l in enumerate(mine) if re.search(rf"released job={job}(\s|$)", l)) + 1]
    at = lambda pat: next(ts(l.split()[0]) for l in mine if pat in l)
    lease = next(re.search(r"lease (\S+) created", l).group(1) for l in mine if "created (durable)" in l)
    r = dict(job=job, submit=at("created (durable)") - t0)
    prev = at("created (durable)")
    for s, pat in STEPS:
        r[s] = at(pat) - prev; prev = at(pat)
    r["total"] = prev - t0
    r["setup"] = r["submit"] + sum(r[s] for s, _ in SETUP)
    r["cleanup"] = sum(r[s] for s, _ in CLEANUP)
    # The simulator's join retries that outlast the format step.
    joined = [ts(l.split()[3])  # k8s-file: TIME STREAM P|F <daos-sim's own time> daos_server: ...
              for f in glob.glob(f"{B}/ctrlogs/{job}/*.log") for l in open(f) if "joined as rank" in l]
    assert len(joined) == 4, f"job {job}: {len(joined)} 'joined' lines in the server logs"
    r["sim_join"] = max(0.0, max(joined) - at("format:"))
    r["sim"] = r["sim_join"] + 2 * POLL  # agent, then the four servers in parallel
    r["overhead"] = r["total"] - r["sim"]
    # The lease's keys: made ahead while the previous job ran, or now
    # (the first job after the broker's start).
    r["ahead"] = any("keys made ahead" in l for l in mine)
    rows.append(r)
med = report("gpuq DAOS lifecycle", "job", 8, [{k: v for k, v in r.items() if k != "ahead"} for r in rows],
             ["submit"] + [s for s, _ in STEPS],
             " (the broker's log; `agent`: what the agent took beyond the join it starts alongside)")
import statistics
for label, want in (("made ahead", True), ("made now", False)):
    sel = [r for r in rows if r["ahead"] == want]
    if sel:
        print(f"  keys {label:<11} {len(sel)} job(s): certificates step median "
              f"{statistics.median(r['certificates'] for r in sel):.3f} s, setup median "
              f"{statistics.median(r['setup'] for r in sel):.3f} s")
print(f"\nmedian  total {med['total']:.2f} s   simulator waits {med['sim']:.2f} s   "
      f"orchestrator overhead {med['overhead']:.2f} s (target: under 1 s)")
import os
if os.path.exists(f"{B}/perf.txt"):
    from daos_times import cpu_report
    samples = []
    for l in open(f"{B}/perf.txt"):
        # COMM (may hold spaces)  PID  TIME:
        head, pid, t = l.rsplit(None, 2)
        samples.append((head.strip(), int(pid), float(t.rstrip(":"))))
    first = float(open(f"{B}/runs.tsv").readline().split()[1])
    cpu_report(samples, int(os.environ["PERF_FREQ"]), len(rows),
               float(os.environ["PERF_T1"]) - first)
PY
