# shellcheck shell=bash
# The local five-host test cluster: shared definitions and every step of
# `up`, `down`, `status`, `shell`, `ssh`, `podman` and `load-image`.
# Sourced by those scripts; see docs/test-cluster.md for the layout.
#
# Everything the harness creates is recorded in $D/manifest *before* it is
# created (namespaces, directories) or right after it exists (PIDs), so that
# `down` removes exactly that, also after `up` crashed half-way.
#
# Two machine-wide things are shared by all clusters on this machine and
# reference-counted in $REGISTRY (one file per live cluster): the
# /run/netns bind mount that `ip netns add` creates on first use, and
# /run/sshd (sshd's privilege-separation dir). The last cluster to go
# removes them if a cluster created them, so the machine ends exactly as it
# was before the first `up`.

set -euo pipefail

HOSTS=(cxl2 da1 da2 da3 da4)
NODES=(da1 da2 da3 da4)
# Hosts with their own Podman API service: all five. A node's runs its
# helper's DAOS containers; cxl2's runs the broker's own (the `dmg` admin
# container, the agent).
PODMAN_HOSTS=(cxl2 da1 da2 da3 da4)
declare -A ADDR=(
  [cxl2]=10.200.0.10
  [da1]=10.200.0.11
  [da2]=10.200.0.12
  [da3]=10.200.0.13
  [da4]=10.200.0.14
  [gpu2]=10.200.0.20
)
# A second GPU host, made only by `slurm up` (integration/cluster/slurm):
# its namespace is ours like the five's.
EXTRA_HOSTS=(gpu2)
# Private: exists only inside the namespaces this harness creates. The
# machine's eth0 uses 192.0.2.0/24; the root namespace gets no address and
# no route into 10.200.0.0/24.
NETMASK=24

REGISTRY=/run/gpuq-cluster.users
HARNESS_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$HARNESS_DIR/../.." && pwd)

# --- the cluster's identity -------------------------------------------------

if [[ ${GPUQ_CLUSTER_DIR:-/} != /* ]]; then
  echo "cluster: GPUQ_CLUSTER_DIR=$GPUQ_CLUSTER_DIR: must be an absolute path" >&2
  exit 2
fi
D=$(realpath -m "${GPUQ_CLUSTER_DIR:-/run/gpuq-cluster}")
# The dir is matched literally against /proc/*/cmdline and mountinfo, and
# `down` removes it: keep it boring and never a top-level system dir.
if [[ ! $D =~ ^/[A-Za-z0-9._/-]+$ || $D =~ /\.\.?(/|$) ]]; then
  echo "cluster: GPUQ_CLUSTER_DIR=$D: use an absolute path of [A-Za-z0-9._/-]" >&2
  exit 2
fi
case $D in
  / | /run | /tmp | /var | /var/* | /etc | /etc/* | /usr | /usr/* | /home | /root)
    echo "cluster: GPUQ_CLUSTER_DIR=$D: refusing a system directory" >&2
    exit 2
    ;;
esac
if [[ $(awk -F/ '{print NF-1}' <<<"$D") -lt 2 ]]; then
  echo "cluster: GPUQ_CLUSTER_DIR=$D: must be at least two levels deep (e.g. /tmp/gpuq-cluster-x)" >&2
  exit 2
fi
# Podman refuses a --runroot longer than 50 characters; ours is
# $D/da1/podman/run.
if ((${#D} > 33)); then
  echo "cluster: GPUQ_CLUSTER_DIR=$D: at most 33 characters (Podman limits its run root, $D/da1/podman/run, to 50)" >&2
  exit 2
fi
MANIFEST=$D/manifest

# Namespace names: <prefix>-<host> and <prefix>-sw (the switch). The prefix
# is a function of the cluster dir, so `down` finds the namespaces even when
# the dir (and its manifest) is gone. The default cluster gets the short,
# typeable `gpuqc`.
default_prefix() {
  if [[ $D == /run/gpuq-cluster ]]; then
    echo gpuqc
  else
    echo "gpuqc-$(printf %s "$D" | sha256sum | cut -c1-6)"
  fi
}
PREFIX=${GPUQ_CLUSTER_PREFIX:-$(default_prefix)}
if [[ -f $MANIFEST ]]; then
  recorded=$(awk '$1 == "prefix" {print $2; exit}' "$MANIFEST")
  PREFIX=${recorded:-$PREFIX}
fi
if [[ ! $PREFIX =~ ^[a-z0-9-]{1,24}$ ]]; then
  echo "cluster: namespace prefix '$PREFIX': use 1-24 of [a-z0-9-]" >&2
  exit 2
fi
ns_of() { echo "$PREFIX-$1"; }
SWITCH_NS=$PREFIX-sw

# --- per-host paths ------------------------------------------------------------

host_dir() { echo "$D/$1"; }
podman_sock() { echo "$D/$1/run/podman.sock"; }
sshd_config() { echo "$D/$1/etc/sshd_config"; }
containers_conf() { echo "$D/$1/etc/containers.conf"; }
SSH_CONFIG=$D/ssh/ssh_config
KNOWN_HOSTS=$D/ssh/known_hosts
CLIENT_KEY=$D/cxl2/ssh/id_ed25519
# The test harness's own key (integration/cluster/ssh: commands on a node
# for set-up and checks). The broker's links use CLIENT_KEY, which the
# nodes restrict to what the links need (see step_sshd).
HARNESS_KEY=$D/cxl2/ssh/id_harness
HOSTS_FILE=$D/etc/hosts

# --- logging and the manifest ---------------------------------------------------

log() { # HOST MESSAGE...
  local host=$1
  shift
  printf '%s [%-5s] %s\n' "$(date -u +%H:%M:%S.%3N)" "$host" "$*" >&2
}
die() {
  log "${1}" "ERROR: ${*:2}"
  exit 1
}
record() { printf '%s\n' "$*" >>"$MANIFEST"; }

# PIDs recorded for a host/role (`pid HOST ROLE PID` lines).
manifest_pids() {
  [[ -f $MANIFEST ]] || return 0
  awk '$1 == "pid" {print $2, $3, $4}' "$MANIFEST"
}

# Does /proc/PID/cmdline name our cluster dir? The only proof we accept that
# a PID is still the process we started (PIDs are reused).
pid_is_ours() {
  local pid=$1 args
  [[ -r /proc/$pid/cmdline ]] || return 1
  mapfile -d '' -t args <"/proc/$pid/cmdline" 2>/dev/null || return 1
  [[ " ${args[*]} " == *"$D/"* || " ${args[*]} " == *"$D "* ]]
}

pid_alive() { # not gone and not a zombie
  local st
  st=$(awk '{sub(/.*\) /, ""); print $1}' "/proc/$1/stat" 2>/dev/null) || return 1
  [[ -n $st && $st != Z && $st != X ]]
}

cmdline_of() {
  local args
  mapfile -d '' -t args <"/proc/$1/cmdline" 2>/dev/null || true
  echo "${args[*]:-?}"
}

need_root() {
  [[ $(id -u) == 0 ]] || {
    echo "cluster: run as root (namespaces, sshd, rootful podman)" >&2
    exit 1
  }
}

need_tools() {
  local t missing=()
  for t in ip nsenter setsid ssh ssh-keygen curl podman flock awk sha256sum; do
    command -v "$t" >/dev/null || missing+=("$t")
  done
  [[ -x /usr/sbin/sshd ]] || missing+=(/usr/sbin/sshd)
  if ((${#missing[@]})); then
    echo "cluster: missing ${missing[*]} (integration/install-deps installs them)" >&2
    exit 1
  fi
}

# --- machine-wide shared state (reference-counted) --------------------------------

# Runs "$@" holding an exclusive lock on /run itself (flock on a directory fd
# needs no lock file, so nothing is left behind).
with_run_lock() {
  local fd
  exec {fd}</run
  flock "$fd"
  "$@"
  local rc=$?
  exec {fd}<&-
  return $rc
}

registry_key() { printf %s "$D" | sha256sum | cut -c1-16; }

register_cluster() {
  mkdir -p "$REGISTRY"
  # Drop entries of clusters whose dir no longer exists (removed by hand).
  local f
  for f in "$REGISTRY"/*; do
    [[ -f $f ]] || continue
    [[ -d $(cat "$f") ]] || rm -f "$f"
  done
  if ! mountpoint -q /run/netns && [[ ! -e $REGISTRY/.made-run-netns ]]; then
    # `ip netns add` will bind-mount /run/netns onto itself; undo at the end.
    [[ -d /run/netns ]] || touch "$REGISTRY/.made-run-netns-dir"
    touch "$REGISTRY/.made-run-netns"
  fi
  if [[ ! -d /run/sshd ]]; then
    mkdir -m 755 /run/sshd
    touch "$REGISTRY/.made-run-sshd"
  fi
  echo "$D" >"$REGISTRY/$(registry_key)"
}

unregister_cluster() {
  [[ -d $REGISTRY ]] || return 0
  rm -f "$REGISTRY/$(registry_key)"
  local f live=0
  for f in "$REGISTRY"/*; do
    [[ -f $f ]] || continue
    if [[ -d $(cat "$f") ]]; then live=1; else rm -f "$f"; fi
  done
  ((live)) && {
    log cluster "other clusters still up; leaving /run/netns and /run/sshd to them"
    return 0
  }
  if [[ -e $REGISTRY/.made-run-netns ]] && mountpoint -q /run/netns &&
    [[ -z $(ls -A /run/netns) ]]; then
    # Not lazy: if anyone mounted a namespace meanwhile, this fails (EBUSY).
    umount /run/netns 2>/dev/null && log cluster "unmounted /run/netns (made by ip netns add)"
  fi
  if [[ -e $REGISTRY/.made-run-netns-dir ]] && ! mountpoint -q /run/netns; then
    rmdir /run/netns 2>/dev/null || true
  fi
  if [[ -e $REGISTRY/.made-run-sshd ]]; then
    rmdir /run/sshd 2>/dev/null || true
  fi
  rm -f "$REGISTRY"/.made-run-netns "$REGISTRY"/.made-run-netns-dir "$REGISTRY"/.made-run-sshd
  rmdir "$REGISTRY" 2>/dev/null || true
}

# --- up: the steps ------------------------------------------------------------------

step_network() {
  # The switch: one namespace holding bridge br0; each host's eth0 is a veth
  # whose peer (named after the host) sits in the switch. Both ends are
  # created directly inside their namespaces, so no link ever appears in the
  # root namespace, not even for a moment.
  record netns "$SWITCH_NS"
  ip netns add "$SWITCH_NS"
  ip -n "$SWITCH_NS" link set lo up
  ip -n "$SWITCH_NS" link add br0 type bridge
  ip -n "$SWITCH_NS" link set br0 up
  log switch "namespace $SWITCH_NS, bridge br0"
  local h ns
  for h in "${HOSTS[@]}"; do
    ns=$(ns_of "$h")
    record netns "$ns"
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    ip -n "$SWITCH_NS" link add "$h" type veth peer name eth0 netns "$ns"
    ip -n "$SWITCH_NS" link set "$h" master br0 up
    ip -n "$ns" addr add "${ADDR[$h]}/$NETMASK" dev eth0
    ip -n "$ns" link set eth0 up
    log "$h" "namespace $ns, eth0 ${ADDR[$h]}/$NETMASK"
  done
}

step_names_and_keys() {
  mkdir -p "$D/etc" "$D/ssh" "$D/cxl2/ssh"
  local h
  {
    echo "# The test cluster's names (not /etc/hosts: the machine's file is never edited)."
    for h in "${HOSTS[@]}"; do echo "${ADDR[$h]} $h"; done
  } >"$HOSTS_FILE"
  ssh-keygen -q -t ed25519 -N '' -C "root@cxl2 ($D)" -f "$CLIENT_KEY"
  ssh-keygen -q -t ed25519 -N '' -C "test harness on cxl2 ($D)" -f "$HARNESS_KEY"
  log cxl2 "client key $CLIENT_KEY, harness key $HARNESS_KEY"
  : >"$KNOWN_HOSTS"
  {
    echo "# ssh -F $SSH_CONFIG <host>: resolves the five names from $HOSTS_FILE's"
    echo "# addresses and checks host keys strictly against $KNOWN_HOSTS only."
    for h in "${HOSTS[@]}" "${EXTRA_HOSTS[@]}"; do
      printf 'Host %s\n  HostName %s\n' "$h" "${ADDR[$h]}"
    done
    cat <<EOF
Host *
  User root
  IdentityFile $CLIENT_KEY
  IdentitiesOnly yes
  UserKnownHostsFile $KNOWN_HOSTS
  GlobalKnownHostsFile /dev/null
  StrictHostKeyChecking yes
  CheckHostIP no
  BatchMode yes
  PasswordAuthentication no
  ConnectTimeout $CONNECT_S
  LogLevel ERROR
EOF
  } >"$SSH_CONFIG"
}

step_node_dirs() { # NODE
  local n=$1 hd
  hd=$(host_dir "$n")
  mkdir -p "$hd"/{etc,ssh,run,state,jobs,test,faults} \
    "$hd"/podman/{root,run,tmp,vartmp,networks} "$D/logs"
  chmod 700 "$hd/ssh"
}

# cxl2: no sshd, no node helper; the broker's state, logs and forwards, and
# its own Podman's storage and config.
step_cxl2_dirs() {
  local hd
  hd=$(host_dir cxl2)
  mkdir -p "$hd"/{etc,ssh,run,state,logs} \
    "$hd"/podman/{root,run,tmp,vartmp,networks} "$D/logs"
  chmod 700 "$hd/ssh"
}

step_sshd() { # NODE
  local n=$1 hd cfg pid
  hd=$(host_dir "$n")
  cfg=$(sshd_config "$n")
  ssh-keygen -q -t ed25519 -N '' -C "$n host key" -f "$hd/ssh/ssh_host_ed25519_key"
  printf '%s,%s %s\n' "$n" "${ADDR[$n]}" "$(cut -d' ' -f1,2 "$hd/ssh/ssh_host_ed25519_key.pub")" \
    >>"$KNOWN_HOSTS"
  # Root key auth from cxl2's address only. The links' key may do what the
  # links do and nothing else: unix-socket forwards over a master started
  # with -N (restrict: no pty, agent, X11, rc; port-forwarding back on;
  # any command it asks for runs /bin/false). As a real site's nodes are
  # set up (docs/operations.md). The harness key may run commands.
  {
    printf 'from="%s",restrict,port-forwarding,command="/bin/false" %s\n' \
      "${ADDR[cxl2]}" "$(cat "$CLIENT_KEY.pub")"
    printf 'from="%s" %s\n' "${ADDR[cxl2]}" "$(cat "$HARNESS_KEY.pub")"
  } >"$hd/ssh/authorized_keys"
  cat >"$cfg" <<EOF
# sshd of simulated storage node $n (gpuq test cluster $D)
ListenAddress ${ADDR[$n]}
Port 22
HostKey $hd/ssh/ssh_host_ed25519_key
PidFile $hd/run/sshd.pid
AuthorizedKeysFile $hd/ssh/authorized_keys
UsePAM no
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
# Keys live under the cluster dir, which may be under /tmp.
StrictModes no
# Forwards from cxl2 only (ssh -L), none back. sshd grants unix-socket
# forwards only where local TCP forwarding is allowed too.
AllowStreamLocalForwarding local
StreamLocalBindUnlink yes
AllowTcpForwarding local
X11Forwarding no
PrintMotd no
LogLevel VERBOSE
EOF
  /usr/sbin/sshd -t -f "$cfg" || die "$n" "sshd -t rejected $cfg"
  # nsenter --net, not `ip netns exec`: the latter also unshares the mount
  # namespace and remounts /sys, hiding the cgroup mounts from what runs
  # under it (environment.md). setsid: not in the caller's terminal session.
  setsid nsenter --net="/run/netns/$(ns_of "$n")" \
    /usr/sbin/sshd -D -f "$cfg" -E "$D/logs/$n-sshd.log" \
    </dev/null >>"$D/logs/$n-sshd.log" 2>&1 &
  pid=$!
  record pid "$n" sshd "$pid"
  log "$n" "sshd pid $pid on ${ADDR[$n]}:22, log $D/logs/$n-sshd.log"
}

step_podman() { # HOST (cxl2 or a node)
  local n=$1 hd conf pid
  hd=$(host_dir "$n")
  conf=$(containers_conf "$n")
  # Settings this machine needs (environment.md): runc, cgroupfs, explicit
  # ulimits, file events. The network config dir is per host so nothing is
  # written to /etc/containers/networks.
  cat >"$conf" <<EOF
[containers]
default_ulimits = ["nofile=4096:4096", "nproc=4096:4096"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
image_copy_tmp_dir = "$hd/podman/vartmp"
[network]
network_config_dir = "$hd/podman/networks"
EOF
  # Own --root/--runroot and --tmpdir (the default tmpdir /run/libpod would
  # be shared between hosts). TMPDIR: where images/load spools archives.
  CONTAINERS_CONF=$conf TMPDIR=$hd/podman/vartmp \
    setsid nsenter --net="/run/netns/$(ns_of "$n")" \
    podman "${PODMAN_ARGS[@]}" --root "$hd/podman/root" --runroot "$hd/podman/run" \
    --tmpdir "$hd/podman/tmp" system service --time=0 "unix://$(podman_sock "$n")" \
    </dev/null >>"$D/logs/$n-podman.log" 2>&1 &
  pid=$!
  record pid "$n" podman "$pid"
  log "$n" "podman service pid $pid, socket $(podman_sock "$n"), log $D/logs/$n-podman.log"
}
PODMAN_ARGS=(--log-level=info)

# The podman CLI on a host's own storage (cxl2 or a node; for the harness
# and humans only: gpuq itself speaks the API).
# PODMAN_TIMEOUT (seconds) bounds it; unset: no limit (interactive use).
host_podman() { # HOST ARGS...
  local n=$1 hd limit=()
  shift
  hd=$(host_dir "$n")
  [[ -n ${PODMAN_TIMEOUT:-} ]] && limit=(timeout "$PODMAN_TIMEOUT")
  # Inside the host's network namespace: `podman exec` and `podman run`
  # with a host network put the process in the *caller's* namespace, and
  # from the root namespace a cluster address would be routed out of the
  # machine (never send traffic to addresses we did not create).
  # (`down` after a crash may find the namespace gone: removing containers
  # sends no traffic, so it then runs where it is.)
  local enter=()
  [[ -e /run/netns/$(ns_of "$n") ]] && enter=(nsenter --net="/run/netns/$(ns_of "$n")")
  CONTAINERS_CONF=$(containers_conf "$n") TMPDIR=$hd/podman/vartmp \
    "${limit[@]}" "${enter[@]}" podman --root "$hd/podman/root" --runroot "$hd/podman/run" \
    --tmpdir "$hd/podman/tmp" "$@"
}

ping_podman() { # HOST -> prints OK
  curl -sS --max-time 2 --unix-socket "$(podman_sock "$1")" http://d/_ping 2>/dev/null
}

# How often the waits below look (ms): 50 here; a TCG guest, where each
# fork and exec costs ~40 ms of emulated CPU, sets more (the site VM: 250),
# so that five hosts' polls do not starve the services they wait for.
# Each wait's limit in seconds stays the same.
POLL_MS=${GPUQ_CLUSTER_POLL_MS:-50}
[[ $POLL_MS =~ ^[1-9][0-9]{0,3}$ ]] || { echo "GPUQ_CLUSTER_POLL_MS must be 1-9999, got $POLL_MS" >&2; exit 2; }
printf -v POLL_S '%d.%03d' $((POLL_MS / 1000)) $((POLL_MS % 1000))
# How long a host may take to come up (s): the waits below end by the
# clock, not by a count of polls. 60 here; a TCG guest starved of host CPU
# sets more (the site VM: 300), where a node's sshd took over 5 s to send
# its banner while five Podman services started (docs/testing.md,
# "Session 24").
WAIT_S=${GPUQ_CLUSTER_WAIT_SECS:-60}
[[ $WAIT_S =~ ^[1-9][0-9]{0,3}$ ]] || { echo "GPUQ_CLUSTER_WAIT_SECS must be 1-9999, got $WAIT_S" >&2; exit 2; }
# ssh's ConnectTimeout (the banner exchange included) in the cluster's
# ssh_config: the harness's commands, and the broker's links unless its
# own ssh_connect_timeout_secs says otherwise. 5 here; the site VM 60.
CONNECT_S=${GPUQ_CLUSTER_SSH_CONNECT_SECS:-5}
[[ $CONNECT_S =~ ^[1-9][0-9]{0,2}$ ]] || { echo "GPUQ_CLUSTER_SSH_CONNECT_SECS must be 1-999, got $CONNECT_S" >&2; exit 2; }

wait_podman() { # HOST: until its Podman API pings (fails if the service died)
  local n=$1 pid end=$((SECONDS + WAIT_S))
  pid=$(awk -v n="$n" '$1 == "pid" && $2 == n && $3 == "podman" {print $4}' "$MANIFEST")
  until [[ $(ping_podman "$n") == OK ]]; do
    pid_alive "$pid" || die "$n" "podman service exited: $(tail -n 3 "$D/logs/$n-podman.log" | tr '\n' ' ')"
    ((SECONDS < end)) || die "$n" "podman API does not answer after $WAIT_S s; see $D/logs/$n-podman.log"
    sleep "$POLL_S"
  done
}

cluster_ssh() { # HOST ARGS... : ssh from cxl2's namespace
  nsenter --net="/run/netns/$(ns_of cxl2)" ssh -F "$SSH_CONFIG" -i "$HARNESS_KEY" "$@"
}

wait_node() { # NODE: until sshd answers over ssh from cxl2 and podman pings
  local n=$1 end err
  wait_podman "$n"
  end=$((SECONDS + WAIT_S))
  until err=$(cluster_ssh "$n" true 2>&1); do
    ((SECONDS < end)) || die "$n" "ssh from cxl2 fails after $WAIT_S s ($err); see $D/logs/$n-sshd.log"
    sleep "$POLL_S"
  done
  log "$n" "ready: ssh from cxl2 ok, podman API ok"
}

# HOOK: the node helper. When `gpuq-node` has a `serve` verb, this starts
# one per node in test mode, in that node's namespace, with its own config
# and socket under $D/<node>/. Until then it is skipped with a note.
# To add it: write $hd/etc/node.toml (state $hd/state, jobs $hd/jobs, test
# dir $hd/test, podman socket $(podman_sock "$n"), socket $hd/run/node.sock),
# start `setsid nsenter --net=... "$bin" --config ... serve` like sshd above,
# `record pid "$n" gpuq-node $!`, and wait for its socket in wait_node.
node_sock() { echo "$D/$1/run/node.sock"; }
node_conf() { echo "$D/$1/etc/node.toml"; }

# The node helper, `gpuq-node serve`, in the node's network namespace, on
# that node's own socket, Podman, jobs and test dirs. With
# GPUQ_CLUSTER_PROFILE_IMAGE (a full sha256 image ID, e.g. the DAOS
# simulator's) the node gets a test-mode profile "test" pinned to it.
step_node_helper() { # NODE
  local n=$1 hd conf pid bin=${GPUQ_NODE_BIN:-${GPUQ_BIN_DIR:-$REPO_ROOT/target/debug}/gpuq-node}
  if [[ ! -x $bin ]]; then
    log "$n" "NOTE: no $bin; node helper skipped (build it: cargo build -p gpuq-node)"
    return 0
  fi
  hd=$(host_dir "$n")
  conf=$(node_conf "$n")
  {
    echo "# Written by integration/cluster for node $n (${GPUQ_CLUSTER_MODE:-test} mode)."
    echo "[node]"
    echo "name = \"$n\""
    echo "socket = \"$(node_sock "$n")\""
    echo "podman_socket = \"$(podman_sock "$n")\""
    echo "jobs_dir = \"$hd/jobs\""
    echo "test_dir = \"$hd/test\""
    echo
    echo "# verify-install: this node's \"installed tree\" (empty until a test fills it)."
    echo "[install]"
    echo "manifest_dir = \"$hd/install/usr/share/gpuq/manifests\""
    echo "prefix = \"$hd/install\""
    if [[ -n ${GPUQ_CLUSTER_PROFILE_IMAGE:-} && ${GPUQ_CLUSTER_MODE:-test} == physical ]]; then
      # Physical mode (the site VM): the node's own NVMe namespaces from
      # $GPUQ_CLUSTER_DEVICES_DIR/<node>.toml ([[devices]] tables: serial,
      # pci, nsid, size_bytes), a physical profile, the production server
      # spec. Only where the host really has those devices.
      local devs=${GPUQ_CLUSTER_DEVICES_DIR:?GPUQ_CLUSTER_MODE=physical needs GPUQ_CLUSTER_DEVICES_DIR}/$n.toml
      [[ -r $devs ]] || die "$n" "physical mode: no $devs (the node's [[devices]])"
      echo
      cat "$devs"
      echo
      echo "[profiles.${GPUQ_CLUSTER_PROFILE_NAME:-test}]"
      echo "image = \"$GPUQ_CLUSTER_PROFILE_IMAGE\""
      echo "daos_version = \"2.8.0\""
      echo "mode = \"physical\""
      echo "port = 10001"
      echo "fabric_iface = \"eth0\""
    elif [[ -n ${GPUQ_CLUSTER_PROFILE_IMAGE:-} ]]; then
      echo
      echo "[profiles.${GPUQ_CLUSTER_PROFILE_NAME:-test}]"
      echo "image = \"$GPUQ_CLUSTER_PROFILE_IMAGE\""
      echo "daos_version = \"2.8.0\""
      echo "mode = \"test\""
      echo "port = 10001"
      echo "fabric_iface = \"eth0\""
      echo "# The simulator's fault switches: write $hd/faults/daos-sim-faults (docs/daos-sim.md)."
      echo "sim_faults_dir = \"$hd/faults\""
    fi
    if [[ -n ${GPUQ_NODE_CLIENT_RUN_DIR:-} ]]; then
      # A GPU host's helper: it serves a lease's client side too.
      echo
      echo "[client]"
      echo "run_dir = \"$GPUQ_NODE_CLIENT_RUN_DIR\""
    fi
  } >"$conf"
  chmod 644 "$conf"
  GPUQ_LOG=${GPUQ_NODE_LOG:-info} setsid nsenter --net="/run/netns/$(ns_of "$n")" \
    "$bin" --config "$conf" serve </dev/null >>"$D/logs/$n-node.log" 2>&1 &
  pid=$!
  record pid "$n" node "$pid"
  local end=$((SECONDS + WAIT_S))
  until [[ -S $(node_sock "$n") ]]; do
    pid_alive "$pid" || die "$n" "gpuq-node exited; see $D/logs/$n-node.log"
    ((SECONDS < end)) || die "$n" "gpuq-node did not bind $(node_sock "$n") within $WAIT_S s"
    sleep "$POLL_S"
  done
  log "$n" "gpuq-node pid $pid, socket $(node_sock "$n"), log $D/logs/$n-node.log"
}

# POST an image archive (docker-archive or oci-archive tar) to a host's API.
load_image_into() { # HOST ARCHIVE -> prints the load report's names/IDs
  local n=$1 archive=$2 out
  out=$(curl -sS --fail-with-body --max-time 300 --unix-socket "$(podman_sock "$n")" \
    -X POST -H 'Content-Type: application/x-tar' --data-binary "@$archive" \
    http://d/v4.0.0/libpod/images/load) || die "$n" "image load failed: $out"
  echo "$out"
}

# --- down: the steps -----------------------------------------------------------

# PIDs (other than ours) whose command line names the cluster dir: conmon,
# `podman container cleanup` exit commands, ssh forwards using the config.
pids_mentioning_dir() {
  local p pid
  for p in /proc/[0-9]*; do
    pid=${p#/proc/}
    [[ $pid == "$$" || $pid == "$BASHPID" || $pid == "$PPID" ]] && continue
    pid_is_ours "$pid" && pid_alive "$pid" && echo "$pid"
  done
  return 0
}

# PIDs whose network namespace is one of ours: everything started inside a
# node (container processes with netns host, ssh sessions, shells). We
# created these namespaces, so whatever is in them is the cluster's.
pids_in_our_namespaces() {
  local ns inodes=() line
  for ns in "$SWITCH_NS" "${HOSTS[@]/#/$PREFIX-}" "${EXTRA_HOSTS[@]/#/$PREFIX-}"; do
    [[ -e /run/netns/$ns ]] || continue
    inodes+=("$(stat -L -c %i "/run/netns/$ns" 2>/dev/null)") || true
  done
  ((${#inodes[@]})) || return 0
  # One stat for all processes; entries vanish while we look (ignored).
  stat -L -c '%i %n' /proc/[0-9]*/ns/net 2>/dev/null | while read -r ino path; do
    for line in "${inodes[@]}"; do
      if [[ $ino == "$line" ]]; then
        path=${path#/proc/}
        echo "${path%%/*}"
      fi
    done
  done
  return 0
}

# SIGTERM, wait up to $2 seconds, then SIGKILL. Logs each PID's cmdline.
end_pids() { # "PIDS" SECONDS WHY
  local pids=($1) secs=$2 why=$3 pid left i
  ((${#pids[@]})) || return 0
  for pid in "${pids[@]}"; do
    log cluster "$why: TERM $pid ($(cmdline_of "$pid"))"
    kill -TERM "$pid" 2>/dev/null || true
  done
  for ((i = 0; i < secs * 1000 / POLL_MS; i++)); do
    left=()
    for pid in "${pids[@]}"; do pid_alive "$pid" && left+=("$pid"); done
    ((${#left[@]})) || return 0
    sleep "$POLL_S"
  done
  for pid in "${left[@]}"; do
    log cluster "$why: KILL $pid (still alive after ${secs}s)"
    kill -KILL "$pid" 2>/dev/null || true
  done
  sleep 0.1
}

# Mount points at or under the cluster dir, deepest first.
our_mounts() {
  awk -v d="$D" '{
      m = $5; gsub(/\\040/, " ", m)
      if (m == d || index(m, d "/") == 1) print length(m), m
    }' /proc/self/mountinfo | sort -rn | cut -d' ' -f2- | uniq
}

# Is $D something `down` may sweep and delete? Yes if absent, if it has our
# manifest, or if it holds nothing but what `up` creates (a crash before
# the manifest). Guards against GPUQ_CLUSTER_DIR pointing at real data:
# down kills processes naming the dir and removes it.
cluster_dir_is_ours() {
  [[ -d $D ]] || return 0
  if [[ -f $MANIFEST ]]; then
    head -n1 "$MANIFEST" | grep -q '^# gpuq test cluster manifest' && return 0
    echo "cluster: $MANIFEST is not a gpuq test cluster manifest" >&2
    return 1
  fi
  local e foreign=()
  for e in "$D"/* "$D"/.[!.]*; do
    [[ -e $e ]] || continue
    case ${e##*/} in
      cxl2 | da1 | da2 | da3 | da4 | gpu2 | slurm | etc | ssh | logs | build | manifest) ;;
      *) foreign+=("${e##*/}") ;;
    esac
  done
  ((${#foreign[@]} == 0)) && return 0
  echo "cluster: $D has no manifest and holds ${foreign[*]}: not a test cluster dir; not touching it" >&2
  return 1
}

# The manifest's namespaces plus the deterministic names (for a lost manifest).
our_namespaces() {
  {
    [[ -f $MANIFEST ]] && awk '$1 == "netns" {print $2}' "$MANIFEST"
    echo "$SWITCH_NS"
    printf "$PREFIX-%s\n" "${HOSTS[@]}" "${EXTRA_HOSTS[@]}"
  } | awk '!seen[$0]++' | while read -r ns; do
    [[ -e /run/netns/$ns ]] && echo "$ns"
  done
  return 0
}
