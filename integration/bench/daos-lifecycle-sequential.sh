#!/usr/bin/env bash
# The baseline for integration/bench/daos-lifecycle.sh: the same DAOS
# lifecycle driven the way the original did it — from cxl2, one `ssh`
# command per node and step, each running the `podman` CLI on that node,
# one node after another:
#   start   per node: ssh → write the node's daos_server.yml (as gpuq-node
#           renders it) into its jobs dir, a new test dir, `podman run -d`
#           of the server (same image, mounts, ulimits, command)
#   format  ssh da1 → `podman exec <server> dmg system query` until the
#           servers wait for a format, then `dmg storage format`
#   join    ssh da1 → `podman exec <server> dmg system query` every 250 ms
#           until 4 ranks are joined (gpuq's poll interval)
#   agent   `podman run -d` of daos_agent on cxl2 (local CLI), until its socket
#   run     the job (`true`)
#   cleanup `podman rm -f` of the agent; ssh da1 → `dmg system stop`; per node:
#           ssh → `podman stop`, `podman rm`, rm -rf of the lease's test dir
# N runs (default 5); prints each run's step times and the medians of:
#   total     the whole lifecycle
#   sim       the DAOS simulator's own deliberate waits on the critical path,
#             counted as in daos-lifecycle.sh: join retries (from the
#             servers' own logs: last rank joined after the format returned)
#             and the 50 ms SIGTERM poll — here for the agent and for each of
#             the four servers, stopped one after another
#   overhead  total − sim
#
# Brings up its own cluster (own dir and namespace prefix) and removes it and
# everything else it made on exit, also on failure or ^C. All ssh runs in
# cxl2's network namespace with the cluster's ssh config and keys.
#
#   sudo integration/bench/daos-lifecycle-sequential.sh          # N=5
set -euo pipefail
. "$(dirname "$0")/lib-stop.sh"
N=${N:-5}
repo=$(cd "$(dirname "$0")/../.." && pwd)
me=daos-lifecycle-sequential.sh
. "$repo/integration/bench/lib-daos.sh"
daos_preflight
cd "$repo"
daos_build_image

daos_make_dirs bs
daos_traps

# The same cluster as daos-lifecycle.sh's (the node helpers idle).
BIN=${GPUQ_BIN_DIR:-$repo/target/debug}
daos_cluster_up

NODES=(da1 da2 da3 da4)
# ssh from cxl2 (integration/cluster/lib.sh cluster_ssh): a new connection
# per command, as the original made them, with the harness's key: the one
# that may run commands (the original's root ssh had a shell). The broker's
# link key is restricted to forwards and runs /bin/false for any command
# (step_sshd): with it every step here exits 1, which is how this baseline
# broke once the nodes were restricted.
on() { daos_in_cxl2 ssh -F "$D/ssh/ssh_config" -i "$D/cxl2/ssh/id_harness" "$@"; }
# The podman CLI on a node's own storage (lib.sh host_podman), as a command
# line for the node's shell.
podman_on() {
    echo "CONTAINERS_CONF=$D/$1/etc/containers.conf TMPDIR=$D/$1/podman/vartmp podman --root $D/$1/podman/root --runroot $D/$1/podman/run --tmpdir $D/$1/podman/tmp"
}
cxl2_podman() {
    CONTAINERS_CONF=$D/cxl2/etc/containers.conf TMPDIR=$D/cxl2/podman/vartmp \
        daos_in_cxl2 podman --root "$D/cxl2/podman/root" \
        --runroot "$D/cxl2/podman/run" --tmpdir "$D/cxl2/podman/tmp" "$@"
}
hostlist="['10.200.0.11', '10.200.0.12', '10.200.0.13', '10.200.0.14']"
# daos_server.yml exactly as gpuq-node renders it for profile `test` in the
# cluster (crates/gpuq-daosconf; compare $D/daN/jobs/<lease>/ after a gpuq job).
server_yml() { # NODE LEASE
    local t=$D/$1/test/$2
    cat <<YML
# Rendered by gpuq for DAOS V2_8; do not edit.
name: daos_server
port: 10001
mgmt_svc_replicas:
- $(daos_addr da1)
provider: ofi+tcp
transport_config:
  allow_insecure: true
control_metadata:
  path: $t/control_meta
disable_vfio: true
fault_path: /$1
system_ram_reserved: 2
disable_hugepages: true
engines:
- targets: 1
  fabric_iface: eth0
  fabric_iface_port: 31416
  storage:
  - class: ram
    scm_mount: /mnt/daos
    scm_size: 4
  - class: file
    bdev_list:
    - $t/bdev0
    bdev_size: 1
    bdev_roles:
    - wal
    - meta
    - data
YML
}
# As gpuq-broker writes them for the admin and agent containers.
control_yml() { printf 'name: daos_server\nport: 10001\nhostlist: %s\ntransport_config:\n  allow_insecure: true\n' "$hostlist"; }
agent_yml() {
    printf "name: daos_server\naccess_points: ['%s']\nport: 10001\ntransport_config:\n  allow_insecure: true\nruntime_dir: /var/run/daos_agent\n" "$(daos_addr da1)"
}

# Keep the simulator's logs past `podman rm` (lib-daos.sh).
daos_watch_logs

dmg() { # LEASE ARGS...: dmg in da1's server container, over ssh
    local l=$1
    shift
    on da1 "$(podman_on da1) exec gpuq-$l-server dmg -o /etc/daos/daos_control.yml -j $*"
}

: >"$B/runs.tsv"
for i in $(seq "$N"); do
    L=seq$i-$(date +%s)
    srv=gpuq-$L-server
    declare -A t=()
    t[start]=$EPOCHREALTIME
    for n in "${NODES[@]}"; do
        ctl_mount=
        [ "$n" = da1 ] && ctl_mount="-v $D/$n/jobs/$L/daos_control.yml:/etc/daos/daos_control.yml:ro"
        on "$n" "set -e
mkdir -p $D/$n/jobs/$L
mkdir $D/$n/test/$L
cat >$D/$n/jobs/$L/daos_server.yml <<'EOF'
$(server_yml "$n" "$L")
EOF
cat >$D/$n/jobs/$L/daos_control.yml <<'EOF'
$(control_yml)
EOF
$(podman_on "$n") run -d --name $srv --network host \
  --ulimit nofile=4096:4096 --ulimit nproc=4096:4096 --stop-timeout 30 \
  -v $D/$n/jobs/$L/daos_server.yml:/etc/daos/daos_server.yml:ro $ctl_mount \
  -v $D/$n/test/$L:$D/$n/test/$L:rw \
  $image daos_server start -o /etc/daos/daos_server.yml >/dev/null"
    done
    t[servers]=$EPOCHREALTIME
    for _ in $(seq 60); do
        q=$(dmg "$L" system query || true)
        grep -q 'uninitialized\|format required' <<<"$q" && break
        sleep 0.25
    done
    grep -q 'uninitialized\|format required' <<<"$q" || { echo "$me: servers never asked for a format: $q" >&2; exit 1; }
    f=$(dmg "$L" storage format)
    grep -q '"host_errors": {}' <<<"$f" || { echo "$me: format failed: $f" >&2; exit 1; }
    t[format]=$EPOCHREALTIME
    for _ in $(seq 60); do
        q=$(dmg "$L" system query || true)
        [ "$(grep -c '"state": "joined"' <<<"$q")" = 4 ] && break
        sleep 0.25
    done
    [ "$(grep -c '"state": "joined"' <<<"$q")" = 4 ] || { echo "$me: 4 ranks did not join: $q" >&2; exit 1; }
    t[join]=$EPOCHREALTIME
    a=$B/daos/$L
    mkdir -p "$a/agent"
    control_yml >"$a/daos_control.yml"
    agent_yml >"$a/daos_agent.yml"
    cxl2_podman run -d --name "gpuq-$L-agent" --network host --cap-drop ALL \
        --security-opt no-new-privileges \
        -v "$a/daos_control.yml:/etc/daos/daos_control.yml:ro" \
        -v "$a/daos_agent.yml:/etc/daos/daos_agent.yml:ro" -v "$a/agent:/var/run/daos_agent" \
        "$image" daos_agent -o /etc/daos/daos_agent.yml -s /var/run/daos_agent >/dev/null
    for _ in $(seq 400); do [ -S "$a/agent/daos_agent.sock" ] && break; sleep 0.05; done
    [ -S "$a/agent/daos_agent.sock" ] || { echo "$me: the agent made no socket" >&2; exit 1; }
    t[agent]=$EPOCHREALTIME
    true
    t[run]=$EPOCHREALTIME
    cxl2_podman rm -f -t 10 "gpuq-$L-agent" >/dev/null
    rm -rf "$a"
    t[stop_agent]=$EPOCHREALTIME
    s=$(dmg "$L" system stop)
    [ "$(grep -c '"Errored": false' <<<"$s")" = 4 ] || { echo "$me: dmg system stop: $s" >&2; exit 1; }
    t[system_stop]=$EPOCHREALTIME
    for n in "${NODES[@]}"; do
        p=$(podman_on "$n")
        on "$n" "set -e; $p stop -t 30 $srv >/dev/null; $p rm $srv >/dev/null; rm -rf $D/$n/test/$L"
    done
    t[stop_wipe]=$EPOCHREALTIME
    daos_ctrlogs_done "$L"
    printf '%s' "$L" >>"$B/runs.tsv"
    for k in start servers format join agent run stop_agent system_stop stop_wipe; do
        printf '\t%s' "${t[$k]}" >>"$B/runs.tsv"
    done
    echo >>"$B/runs.tsv"
    unset t
    echo "run $i ($L) done" >&2
done

python3 - "$B" "$repo/integration/bench" <<'PY'
import glob, sys
B = sys.argv[1]
sys.dont_write_bytecode = True  # nothing left in the tree
sys.path.insert(0, sys.argv[2])
from daos_times import POLL, report, ts
STEPS = ["servers", "format", "join", "agent", "run", "stop_agent", "system_stop", "stop_wipe"]
rows = []
for line in open(f"{B}/runs.tsv"):
    lease, *stamps = line.split()
    stamps = [float(x) for x in stamps]
    r = {s: stamps[k + 1] - stamps[k] for k, s in enumerate(STEPS)}
    r["lease"], r["total"] = lease, stamps[-1] - stamps[0]
    r["setup"] = sum(r[s] for s in STEPS[:4])
    r["cleanup"] = sum(r[s] for s in STEPS[5:])
    joined = [ts(l.split()[3])  # k8s-file: TIME STREAM P|F <daos-sim's own time> daos_server: ...
              for f in glob.glob(f"{B}/ctrlogs/{lease}/*.log") for l in open(f) if "joined as rank" in l]
    assert len(joined) == 4, f"{lease}: {len(joined)} 'joined' lines in the server logs"
    r["sim_join"] = max(0.0, max(joined) - stamps[STEPS.index("format") + 1])
    r["sim"] = r["sim_join"] + POLL * (1 + 4)  # the agent, then four servers one by one
    r["overhead"] = r["total"] - r["sim"]
    rows.append(r)
med = report("sequential ssh + podman CLI lifecycle", "lease", 17, rows, STEPS, "")
print(f"\nmedian  total {med['total']:.2f} s   simulator waits {med['sim']:.2f} s   overhead {med['overhead']:.2f} s")
PY
