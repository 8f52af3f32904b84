# shellcheck shell=bash
# The setup the DAOS benchmarks share (daos-exec.sh, daos-lifecycle.sh,
# daos-lifecycle-sequential.sh): checks, the simulator image, a private
# test cluster (docs/test-cluster.md) with its own dir and namespace
# prefix, the broker's config and the broker itself in cxl2's network
# namespace, the job waits, the simulator-log keeper, and the cleanup that
# undoes all of it on exit, also on failure or ^C.
#
# Sourced, after `set -euo pipefail`, by a script that has set
#   repo   the repository root (the script runs with it as its cwd)
#   me     its own name, for messages
# and, before the functions that start or ask gpuq things,
#   BIN    the dir with gpuq, gpuq-broker and gpuq-node.
# Call the functions from the script's own shell, never inside $(...) or a
# pipe: they set the globals that daos_cleanup reads (B, CG, broker,
# watcher). Ends only what they started, by PID; nothing is sent to
# 10.200.0.0/24 from the root namespace (the broker, the jobs and every
# ssh run in cxl2's namespace).
#
# In the order a script calls them:
#   daos_preflight          root and python3, or exit 1
#   daos_check_bins DIR     DIR has gpuq, gpuq-broker, gpuq-node, or exit 1
#   daos_build_image        integration/daos-sim-image → $archive, $image
#   daos_make_dirs TAG      B=/tmp/gpuq-TAG.XXXXXX (root-owned, 755), the
#                           cluster dir D=$B/c, PREFIX=gpuqTAG-<hash of D>,
#                           exported as GPUQ_CLUSTER_DIR/GPUQ_CLUSTER_PREFIX
#   daos_cgroup NAME        CG=<cgroup2 mount>/NAME: the broker's cgroup_parent
#   daos_traps              EXIT → daos_cleanup; INT → exit 130; TERM → exit 143
#   daos_cluster_up         integration/cluster/up with $BIN and the image
#   daos_write_broker_toml  $B/broker.toml: [broker] and the [daos] tables
#   daos_start_broker       the broker in cxl2's netns; $broker, $GPUQ_SOCKET
#   daos_watch_logs         keep containers' logs in $B/ctrlogs/new; $watcher
#   daos_ctrlogs_done NAME  move $B/ctrlogs/new to $B/ctrlogs/NAME
#   daos_wait_job ID POLL   until job ID has ended (polling every POLL s) and,
#                           for up to 30 s, its lease is released; sets $st
#   daos_addr NODE          a node's address (da1 → 10.200.0.11)
#   daos_in_cxl2 CMD...     CMD in cxl2's network namespace

broker= watcher= CG=

daos_preflight() {
    [ "$(id -u)" = 0 ] || { echo "$me: run as root (namespaces, sshd, rootful podman)" >&2; exit 1; }
    command -v python3 >/dev/null || { echo "$me: needs python3" >&2; exit 1; }
}

daos_check_bins() { # DIR
    local b
    for b in gpuq gpuq-broker gpuq-node; do
        [ -x "$1/$b" ] || { echo "$me: no $1/$b (cargo build --workspace --bins)" >&2; exit 1; }
    done
}

daos_build_image() {
    local img
    img=$(integration/daos-sim-image/build.sh --out "$repo/target/bench-daos-sim-image" 2>/dev/null)
    archive=$(echo "$img" | sed -n 's/^archive: //p')
    image=$(echo "$img" | sed -n 's/^image: //p')
    [ -n "$image" ] || { echo "$me: integration/daos-sim-image/build.sh printed no image" >&2; exit 1; }
}

# Our own everything: B holds the broker's config, state and logs, whatever
# the script keeps, and the cluster dir B/c (at most 33 characters:
# /tmp/gpuq-XX.XXXXXX/c is 21 with a two-letter TAG).
daos_make_dirs() { # TAG
    B=$(mktemp -d "/tmp/gpuq-$1.XXXXXX")
    chmod 755 "$B"   # root-owned, not group/world-writable: the broker checks
    D=$B/c
    PREFIX=gpuq$1-$(printf %s "$D" | sha256sum | cut -c1-6)
    export GPUQ_CLUSTER_DIR=$D GPUQ_CLUSTER_PREFIX=$PREFIX
}

daos_cgroup() { # NAME
    local cg2
    cg2=$(awk '$3 == "cgroup2" { print $2; exit }' /proc/self/mounts)
    CG=$cg2/$1
}

# The log keeper, the broker (SIGTERM: it ends its ssh masters; only if the
# PID is still ours), the cluster (containers, also half-started ones, sshd
# sessions, namespaces), leftover job cgroups, then B. Keeps the exit status.
daos_cleanup() {
    local rc=$? i d
    trap '' INT TERM
    set +e
    [ -n "$watcher" ] && kill "$watcher" 2>/dev/null && wait "$watcher" 2>/dev/null
    # daos-lifecycle.sh's PERF_CPU sampler, if a run ended while it ran.
    [ -n "${perf_pid:-}" ] && kill -INT "$perf_pid" 2>/dev/null && wait "$perf_pid" 2>/dev/null
    if [ -n "$broker" ] && grep -qF "$B/broker.toml" "/proc/$broker/cmdline" 2>/dev/null; then
        kill -TERM "$broker"
        for i in $(seq 200); do kill -0 "$broker" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$broker" 2>/dev/null && { echo "$me: broker $broker ignored SIGTERM; KILL" >&2; kill -KILL "$broker"; }
        wait "$broker" 2>/dev/null
    fi
    # KEEP=DIR: the broker's, nodes' and Podman services' logs outlive the run.
    if [ -n "${KEEP:-}" ]; then
        mkdir -p "$KEEP" && cp -a "$B/broker.log" "$B/ctrlogs" "$D/logs" "$KEEP/" 2>/dev/null
        echo "$me: logs kept in $KEEP" >&2
    fi
    "$repo/integration/cluster/down" >"$B/down.log" 2>&1 || { echo "$me: cluster down failed:" >&2; cat "$B/down.log" >&2; }
    if [ -n "$CG" ]; then
        for d in "$CG"/gpuq-job-*; do [ -d "$d" ] && { echo 1 >"$d/cgroup.kill"; sleep 0.2; rmdir "$d"; }; done
        [ -d "$CG" ] && rmdir "$CG"
    fi
    rm -rf "$B"
    exit "$rc"
}

daos_traps() {
    trap daos_cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
}

daos_cluster_up() {
    echo "== cluster $D (namespaces $PREFIX-*), image $image" >&2
    GPUQ_BIN_DIR=$BIN GPUQ_CLUSTER_IMAGE=$archive GPUQ_CLUSTER_PROFILE_IMAGE=$image \
        integration/cluster/up >"$B/up.log" 2>&1 || { cat "$B/up.log" >&2; exit 1; }
}

daos_addr() { echo "10.200.0.1${1#da}"; }

daos_in_cxl2() { nsenter --net="/run/netns/$PREFIX-cxl2" "$@"; }

# Root-owned and not writable by others: the broker checks.
daos_write_broker_toml() {
    local n
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
                "$n" "$n" "$(daos_addr "$n")" "$D/$n/run/node.sock" "$D/$n/run/podman.sock"
        done
        printf '\n[daos.profiles.test]\nimage = "%s"\nreplicas = ["%s"]\n' "$image" "$(daos_addr da1)"
    } >"$B/broker.toml"
    chmod 644 "$B/broker.toml"
}

# The broker on cxl2: in its network namespace, its own session (a ^C to
# the script must not reach it before cleanup stops it in order). Returns
# once it answers `gpuq list`; exits 1 if it ends first.
daos_start_broker() {
    setsid nsenter --net="/run/netns/$PREFIX-cxl2" "$BIN/gpuq-broker" --config "$B/broker.toml" \
        </dev/null >>"$B/broker.log" 2>&1 &
    broker=$!
    export GPUQ_SOCKET=$B/broker.sock
    for _ in $(seq 200); do
        [ -S "$GPUQ_SOCKET" ] && "$BIN/gpuq" list >/dev/null 2>&1 && break
        kill -0 "$broker" 2>/dev/null || { echo "$me: the broker exited:" >&2; cat "$B/broker.log" >&2; exit 1; }
        sleep 0.05
    done
}

# Podman (k8s-file log driver) deletes a container's log with the container:
# hard-link each new one (same file system) into $B/ctrlogs/new so the
# simulator's own log lines, with their timestamps, outlive cleanup.
# One process polling every 50 ms (a shell loop forked `sleep` and `ln`
# twenty times a second: CPU taken from the lifecycle it measures).
_daos_watch_logs_loop() {
    exec python3 -c '
import glob, os, sys, time
D, B = sys.argv[1], sys.argv[2]
pat = [f"{D}/{h}/podman/root/overlay-containers/*/userdata/ctr.log"
       for h in ("cxl2", "da1", "da2", "da3", "da4")]
while True:
    for p in pat:
        for f in glob.glob(p):
            cid = f.split("/")[-3]
            try:
                os.link(f, f"{B}/ctrlogs/new/{cid}.log")
            except OSError:
                pass  # linked already, or the log (or new/) is gone
    time.sleep(0.05)
' "$D" "$B"
}
daos_watch_logs() {
    mkdir -p "$B/ctrlogs/new"
    _daos_watch_logs_loop &
    watcher=$!
}

daos_ctrlogs_done() { # NAME: the logs since the last call are NAME's
    mv "$B/ctrlogs/new" "$B/ctrlogs/$1"
    mkdir "$B/ctrlogs/new"
}

daos_wait_job() { # ID POLL
    while :; do
        st=$("$BIN/gpuq" status "$1" --json | sed -n 's/^  "state": "\([a-z_]*\)",$/\1/p')
        case $st in queued | running) sleep "$2" ;; *) break ;; esac
    done
    for _ in $(seq 600); do [ -e "$B/state/active.json" ] || break; sleep 0.05; done
}
