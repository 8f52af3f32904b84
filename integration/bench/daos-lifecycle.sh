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
# Also per step (the broker's own log lines) and `admin_kill`: the seconds
# the admin container's stop waited before Podman SIGKILLed it (its `sleep`
# runs as PID 1 and ignores SIGTERM; gpuq's grace is 1 s) — part of
# system_stop, and of the overhead: it is gpuq's container, not a simulator wait.
# Compare with integration/bench/daos-lifecycle-sequential.sh (the same
# lifecycle by `ssh` + the `podman` CLI, one node after another).
#
# Brings up its own cluster (own dir and namespace prefix) and removes it,
# the broker and everything else it made on exit, also on failure or ^C.
#
#   sudo integration/bench/daos-lifecycle.sh          # N=5
#   sudo N=10 integration/bench/daos-lifecycle.sh
# Env: N, GPUQ_BIN_DIR (default target/debug: gpuq, gpuq-broker, gpuq-node).
set -euo pipefail
N=${N:-5}
repo=$(cd "$(dirname "$0")/../.." && pwd)
me=daos-lifecycle.sh
[ "$(id -u)" = 0 ] || { echo "$me: run as root (namespaces, sshd, rootful podman)" >&2; exit 1; }
command -v python3 >/dev/null || { echo "$me: needs python3" >&2; exit 1; }
BIN=${GPUQ_BIN_DIR:-$repo/target/debug}
for b in gpuq gpuq-broker gpuq-node; do
    [ -x "$BIN/$b" ] || { echo "$me: no $BIN/$b (cargo build --workspace --bins)" >&2; exit 1; }
done
cd "$repo"
img=$(integration/daos-sim-image/build.sh --out "$repo/target/bench-daos-sim-image" 2>/dev/null)
archive=$(echo "$img" | sed -n 's/^archive: //p')
image=$(echo "$img" | sed -n 's/^image: //p')
[ -n "$image" ] || { echo "$me: integration/daos-sim-image/build.sh printed no image" >&2; exit 1; }

# Our own everything: B holds the broker's config, state and logs, and the
# cluster dir B/c (at most 33 characters: /tmp/gpuq-bl.XXXXXX/c is 21).
B=$(mktemp -d /tmp/gpuq-bl.XXXXXX)
chmod 755 "$B"   # root-owned, not group/world-writable: the broker checks
D=$B/c
PREFIX=gpuqbl-$(printf %s "$D" | sha256sum | cut -c1-6)
export GPUQ_CLUSTER_DIR=$D GPUQ_CLUSTER_PREFIX=$PREFIX
cg2=$(awk '$3 == "cgroup2" { print $2; exit }' /proc/self/mounts)
CG=$cg2/gpuq-bench-$$
broker= watcher=
cleanup() {
    local rc=$? i
    trap '' INT TERM
    set +e
    [ -n "$watcher" ] && kill "$watcher" 2>/dev/null && wait "$watcher" 2>/dev/null
    # SIGTERM: the broker ends its ssh masters. Only if the PID is still ours.
    if [ -n "$broker" ] && grep -qF "$B/broker.toml" "/proc/$broker/cmdline" 2>/dev/null; then
        kill -TERM "$broker"
        for i in $(seq 200); do kill -0 "$broker" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$broker" 2>/dev/null && { echo "$me: broker $broker ignored SIGTERM; KILL" >&2; kill -KILL "$broker"; }
        wait "$broker" 2>/dev/null
    fi
    "$repo/integration/cluster/down" >"$B/down.log" 2>&1 || { echo "$me: cluster down failed:" >&2; cat "$B/down.log" >&2; }
    for d in "$CG"/gpuq-job-*; do [ -d "$d" ] && { echo 1 >"$d/cgroup.kill"; sleep 0.2; rmdir "$d"; }; done
    [ -d "$CG" ] && rmdir "$CG"
    rm -rf "$B"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

echo "== cluster $D (namespaces $PREFIX-*), image $image" >&2
GPUQ_BIN_DIR=$BIN GPUQ_CLUSTER_IMAGE=$archive GPUQ_CLUSTER_PROFILE_IMAGE=$image \
    integration/cluster/up >"$B/up.log" 2>&1 || { cat "$B/up.log" >&2; exit 1; }

addr() { echo "10.200.0.1${1#da}"; }
{
    cat <<TOML
[broker]
socket = "$B/broker.sock"
state_dir = "$B/state"
log_root = "$B/logs"
maintenance_file = "$B/etc/maintenance.json"
runner = "direct"
cgroup_parent = "$CG"
default_time = "10m"
max_time = "1h"
gpu = "none"

[daos]
run_dir = "$B/daos"
podman_socket = "$D/cxl2/run/podman.sock"
forward_dir = "$D/cxl2/run/links"
identity_file = "$D/cxl2/ssh/id_ed25519"
known_hosts_file = "$D/ssh/known_hosts"
ssh_config_file = "$D/ssh/ssh_config"
join_timeout_secs = 15
link_timeout_secs = 10
TOML
    for n in da1 da2 da3 da4; do
        printf '\n[[daos.nodes]]\nname = "%s"\nhost = "%s"\naddress = "%s"\nnode_socket = "%s"\npodman_socket = "%s"\n' \
            "$n" "$n" "$(addr "$n")" "$D/$n/run/node.sock" "$D/$n/run/podman.sock"
    done
    printf '\n[daos.profiles.test]\nimage = "%s"\nreplicas = ["%s"]\n' "$image" "$(addr da1)"
} >"$B/broker.toml"
chmod 644 "$B/broker.toml"

# The broker on cxl2: in its network namespace, its own session (a ^C to
# this script must not reach it before cleanup stops it in order).
setsid nsenter --net="/run/netns/$PREFIX-cxl2" "$BIN/gpuq-broker" --config "$B/broker.toml" \
    </dev/null >>"$B/broker.log" 2>&1 &
broker=$!
export GPUQ_SOCKET=$B/broker.sock
for _ in $(seq 200); do
    [ -S "$GPUQ_SOCKET" ] && "$BIN/gpuq" list >/dev/null 2>&1 && break
    kill -0 "$broker" 2>/dev/null || { echo "$me: the broker exited:" >&2; cat "$B/broker.log" >&2; exit 1; }
    sleep 0.05
done
# Its four SSH links come up in the background; the first job would wait.
for _ in $(seq 300); do
    [ "$(grep -c 'node link up' "$B/broker.log")" -ge 4 ] && break
    sleep 0.05
done

# Podman (k8s-file log driver) deletes a container's log with the container:
# hard-link each new one (same file system) so the simulator's own log lines,
# with their timestamps, outlive cleanup.
mkdir -p "$B/ctrlogs/new"
watch_logs() {
    local f id
    while :; do
        for f in "$D"/{cxl2,da1,da2,da3,da4}/podman/root/overlay-containers/*/userdata/ctr.log; do
            [ -e "$f" ] || continue
            id=${f%/userdata/ctr.log}
            id=${id##*/}
            [ -e "$B/ctrlogs/new/$id.log" ] || ln "$f" "$B/ctrlogs/new/$id.log" 2>/dev/null || true
        done
        sleep 0.05
    done
}
watch_logs &
watcher=$!

mkdir -p "$B/w"
cd "$B/w"
: >"$B/runs.tsv"
for i in $(seq "$N"); do
    t0=$EPOCHREALTIME
    id=$("$BIN/gpuq" submit --inst test -- true 2>/dev/null)
    # Until the job has ended and the lease is released (active.json gone).
    while :; do
        st=$("$BIN/gpuq" status "$id" --json | sed -n 's/^  "state": "\([a-z_]*\)",$/\1/p')
        case $st in queued | running) sleep 0.2 ;; *) break ;; esac
    done
    for _ in $(seq 600); do [ -e "$B/state/active.json" ] || break; sleep 0.05; done
    [ -e "$B/state/active.json" ] && { echo "$me: job $id: lease not released after 30 s" >&2; exit 1; }
    [ "$st" = completed ] || { echo "$me: job $id ended $st:" >&2; "$BIN/gpuq" log "$id" >&2; exit 1; }
    mv "$B/ctrlogs/new" "$B/ctrlogs/$id"
    mkdir "$B/ctrlogs/new"
    printf '%s\t%s\n' "$id" "$t0" >>"$B/runs.tsv"
    echo "job $id done" >&2
done

python3 - "$B" <<'PY'
import datetime as dt, glob, re, statistics as st, sys
B = sys.argv[1]
def ts(s):  # RFC 3339 UTC with up to 9 decimals → epoch seconds
    s = s.rstrip("Z").split("+")[0]
    head, _, frac = s.partition(".")
    t = dt.datetime.strptime(head, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=dt.timezone.utc).timestamp()
    return t + float("0." + frac) if frac else t
ansi = re.compile(r"\x1b\[[0-9;]*m")
blog = [ansi.sub("", l) for l in open(f"{B}/broker.log")]
plog = list(open(f"{B}/c/logs/cxl2-podman.log"))
# Each step ends at its log line; the first starts when the lease is created.
STEPS = [("preflight", "preflight passed"), ("servers", "servers started"), ("format", "format:"),
         ("join", "join:"), ("agent", "agent:"), ("run", "ended job="),
         ("stop_agent", "cleanup stop_agent"), ("system_stop", "cleanup system_stop"),
         ("stop_servers", "cleanup stop_servers"), ("wipe", "cleanup wipe"), ("release", " released")]
SETUP, CLEANUP = STEPS[:5], STEPS[6:]
POLL = 0.05  # daos-sim's SIGTERM flag poll (server.rs / agent.rs main loops)
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
    # gpuq's admin container runs `sleep` as PID 1, which ignores SIGTERM:
    # its stop waits out the 1 s grace, and Podman says so.
    r["admin_kill"] = sum(1.0 for l in plog if f"container gpuq-{lease}-admin in 1 seconds, resorting to SIGKILL" in l)
    rows.append(r)
med = {c: st.median(r[c] for r in rows) for c in rows[0] if c != "job"}
cols = ["total", "setup", "run", "cleanup", "sim_join", "sim", "overhead", "admin_kill"]
print(f"\ngpuq DAOS lifecycle, {len(rows)} jobs (seconds)")
print(f"{'job':<8}" + "".join(f"{c:>11}" for c in cols))
for r in rows:
    print(f"{r['job']:<8}" + "".join(f"{r[c]:11.3f}" for c in cols))
print(f"{'median':<8}" + "".join(f"{med[c]:11.3f}" for c in cols))
print("\nmedian per step (the broker's log; admin_kill: the admin container's 1 s stop grace, inside system_stop)")
for s in ["submit"] + [s for s, _ in STEPS]:
    print(f"  {s:<13}{med[s]:7.3f}")
print(f"\nmedian  total {med['total']:.2f} s   simulator waits {med['sim']:.2f} s   "
      f"orchestrator overhead {med['overhead']:.2f} s (target: under 1 s)")
PY
