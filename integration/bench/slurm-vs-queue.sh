#!/usr/bin/env bash
# What Slurm adds around a DAOS lease, against gpuq's own queue, on the same
# five-host test cluster (docs/slurm.md, docs/benchmarks.md "Slurm"):
#
#   queue  `gpuq submit --inst test -- true` (as root) → the lease released
#          (the broker's active.json gone), polled every 50 ms;
#   slurm  `sbatch` of a job with `#BB_LUA daos pool=daos capacity=1` that
#          runs `true` (as uid 61001) → its teardown done (gpuq-slurm's job
#          record gone), polled every 50 ms; split into submit → the job's
#          first line, and the job's last line → the site free;
#   gpu2   the same Slurm job with `--nodelist=gpu2`: the lease's client
#          side (files, agent) on gpu2 through gpu2's gpuq-node over an
#          ssh link, instead of on cxl2 itself.
#
# The same lease (gpuq-lifecycle: preflight, four servers, format, joins,
# agent, then the whole cleanup and wipe) in both; N jobs one after another
# each (default 5), the queue's first, then the broker stopped and Slurm
# started (integration/cluster/slurm: Debian's slurmctld, slurmd, munged,
# defaults but for what the cluster needs). Prints every job and the
# medians, and the ratio slurm/queue.
#
#   sudo integration/bench/slurm-vs-queue.sh          # N=5
#   sudo N=9 integration/bench/slurm-vs-queue.sh
# Env: N, GPUQ_BIN_DIR (default target/debug: gpuq, gpuq-broker, gpuq-node,
# gpuq-slurm). Removes everything it made on exit (lib-daos.sh), Slurm's
# daemons with the cluster.
set -euo pipefail
. "$(dirname "$0")/lib-stop.sh"
N=${N:-5}
repo=$(cd "$(dirname "$0")/../.." && pwd)
me=slurm-vs-queue.sh
. "$repo/integration/bench/lib-daos.sh"
daos_preflight
BIN=${GPUQ_BIN_DIR:-$repo/target/debug}
daos_check_bins "$BIN"
[ -x "$BIN/gpuq-slurm" ] || { echo "$me: no $BIN/gpuq-slurm (cargo build -p gpuq-slurm)" >&2; exit 1; }
command -v slurmctld >/dev/null || { echo "$me: needs Slurm (integration/install-deps)" >&2; exit 1; }
cd "$repo"
daos_build_image
daos_make_dirs sq
daos_cgroup "gpuq-bench-$$"
daos_traps
daos_cluster_up
daos_write_broker_toml
daos_start_broker
for _ in $(seq 300); do
    [ "$(grep -c 'node link up' "$B/broker.log")" -ge 4 ] && break
    sleep 0.05
done

: >"$B/queue.tsv"
mkdir -p "$B/w"
for i in $(seq "$N"); do
    t0=$EPOCHREALTIME
    id=$(cd "$B/w" && "$BIN/gpuq" submit --inst test -- true 2>/dev/null)
    daos_wait_job "$id" 0.05
    t1=$EPOCHREALTIME
    [ -e "$B/state/active.json" ] && { echo "$me: job $id: lease not released after 30 s" >&2; exit 1; }
    [ "$st" = completed ] || { echo "$me: job $id ended $st" >&2; exit 1; }
    printf '%s\t%s\t%s\n' "$id" "$t0" "$t1" >>"$B/queue.tsv"
    echo "queue job $id done" >&2
done

# The broker goes (it ends its ssh masters on SIGTERM), Slurm comes.
kill -TERM "$broker"
for _ in $(seq 200); do kill -0 "$broker" 2>/dev/null || break; sleep 0.1; done
wait "$broker" 2>/dev/null || true
broker=
{
    printf '[slurm]\nstate_dir = "%s"\nagent_host = "cxl2"\n' "$B/slurm-state"
    printf '[[slurm.gpu_hosts]]\nname = "gpu2"\nhost = "10.200.0.20"\nnode_socket = "%s"\npodman_socket = "%s"\nrun_dir = "%s"\n\n' \
        "$D/gpu2/run/node.sock" "$D/gpu2/run/podman.sock" "$D/gpu2/client"
    sed -n '/^\[daos\]/,$p' "$B/broker.toml"
} >"$B/gpuq-slurm.toml"
chmod 644 "$B/gpuq-slurm.toml"
GPUQ_BIN_DIR=$BIN GPUQ_SLURM_CONFIG=$B/gpuq-slurm.toml GPUQ_SLURM_GPU2_CLIENT=1 \
    GPUQ_CLUSTER_IMAGE=$archive GPUQ_CLUSTER_PROFILE_IMAGE=$image integration/cluster/slurm up >"$B/slurm-up.log" 2>&1 ||
    { cat "$B/slurm-up.log" >&2; exit 1; }
u=$B/u
mkdir -p "$u"
chown 61001:61001 "$u"
: >"$B/slurm.tsv"
: >"$B/gpu2.tsv"
for k in $(seq $((2 * N))); do
    # cxl2 and gpu2 by turns, so that both see the same machine load.
    if ((k % 2)); then host=cxl2; else host=gpu2; fi
    i=$k
    cat >"$u/job$i.sh" <<EOF
#!/bin/bash
#SBATCH -o $u/job$i.out
#BB_LUA daos pool=daos capacity=1
date +%s.%N > $u/start$i
true
date +%s.%N > $u/end$i
EOF
    chown 61001:61001 "$u/job$i.sh"
    t0=$EPOCHREALTIME
    id=$(integration/cluster/slurm as 61001 sbatch --parsable --nodelist=$host "$u/job$i.sh")
    # Until the job has run and its teardown has removed its record.
    for _ in $(seq 2400); do
        [ -e "$u/end$i" ] && [ ! -e "$B/slurm-state/jobs/$id.json" ] && break
        sleep 0.05
    done
    t1=$EPOCHREALTIME
    [ -e "$u/end$i" ] && [ ! -e "$B/slurm-state/jobs/$id.json" ] ||
        { echo "$me: slurm job $id: not done after 120 s" >&2; tail -20 "$D/logs/slurmctld.log" >&2; exit 1; }
    [ "$host" = cxl2 ] && tsv=$B/slurm.tsv || tsv=$B/gpu2.tsv
    printf '%s\t%s\t%s\t%s\t%s\n' "$id" "$t0" "$t1" "$(cat "$u/start$i")" "$(cat "$u/end$i")" >>"$tsv"
    echo "slurm job $id on $host done" >&2
done

python3 - "$B" <<'PY'
import statistics, sys
B = sys.argv[1]
q = [float(t1) - float(t0) for _, t0, t1 in (l.split() for l in open(f"{B}/queue.tsv"))]
def series(name):
    rows = [list(map(float, l.split()[1:])) for l in open(f"{B}/{name}.tsv")]
    s = [t1 - t0 for t0, t1, _, _ in rows]
    start = [a - t0 for t0, _, a, _ in rows]
    free = [t1 - e for _, t1, _, e in rows]
    return s, start, free
mq = statistics.median(q)
print("queue  (submit → lease released):   " + "  ".join(f"{x:.2f}" for x in q))
for name, what in (("slurm", "slurm on cxl2"), ("gpu2", "slurm on gpu2")):
    s, start, free = series(name)
    print(f"{what} (sbatch → teardown done): " + "  ".join(f"{x:.2f}" for x in s))
    print("  of which sbatch → job's first line: " + "  ".join(f"{x:.2f}" for x in start))
    print("  of which job's last line → free:    " + "  ".join(f"{x:.2f}" for x in free))
    ms = statistics.median(s)
    print(f"  median {ms:.2f} s   /queue {ms / mq:.1f}×   (to the job {statistics.median(start):.2f} s, "
          f"after it {statistics.median(free):.2f} s)")
print(f"\nqueue median {mq:.2f} s")
PY
