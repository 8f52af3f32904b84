#!/bin/bash
# Runs as root inside the site VM (systemd as PID 1): the five-host test
# cluster (integration/cluster, unchanged scripts) with the four storage
# nodes in PHYSICAL mode on the guest's emulated NVMe, the broker on cxl2
# with runner = "systemd", and an ordinary user's `--inst` job that
# writes data through `gpuq daos-exec`; then the release is checked on the
# devices themselves. Prints "SITE-CHECK <name> ok", "SITE-TIME <step>
# <seconds>" and "SITE-FAIL <name>: why" (then exits 1).
#
# Allowlists (serial + PCI + nsid + size of the guest's NVMe, `up`):
#   da1 SN-SITE-0001 0000:00:11.0 nsid 1     da2 SN-SITE-0002 0000:00:12.0 nsid 1
#   da3 SN-SITE-0003 0000:00:13.0 nsid 1     da4 SN-SITE-0005 0000:00:15.0 nsid 1 and 2
# SN-SITE-0004 (0000:00:14.0) is on no allowlist: it must never be written.
#
# SITE_SCENARIOS=inst runs only scenario 1 without the broker kill (the
# cgroup-v1 boot: an --inst job and daos-exec from inside it, and from
# outside refused; its cancel and time limit); the default, all, runs
# every scenario.
set -eu
F=${F:-/gpuq}
ALL=1; [ "${SITE_SCENARIOS:-all}" = all ] || ALL=0
# --stor nvmeof profiles on the nodes and the broker: for all scenarios and
# for stor-bench (integration/bench/stor-nvmeof.sh: the cluster, the
# activation, then only the benchmark).
STOR=$ALL; [ "${SITE_SCENARIOS:-all}" != stor-bench ] || STOR=1
# --stor nfsrdma profiles: for all scenarios and for stor-nfs (the cluster,
# the activation, then only scenario 5).
NFS=0; case ${SITE_SCENARIOS:-all} in all|stor-nfs|stor-nfs-bench) NFS=1;; esac
D=/srv/cl
P=site
NS_CXL2=/run/netns/$P-cxl2
# Each emulated namespace (integration/vm/site/up): 2 GiB, room for the
# smallest pool DAOS allows over one target per rank (1 GiB of NVMe each).
NS_BYTES=2147483648
state_dir=/var/lib/gpuq-site/state
T0=$(date +%s.%N)
last=$T0
# Helpers this script froze (SIGSTOP), let go again by thaw (also on failure).
FROZEN=""
thaw() { for p in $FROZEN; do kill -CONT "$p" 2>/dev/null || true; done; FROZEN=""; }
fail() {
  thaw
  echo "SITE-FAIL $1: $2"
  tail -n 40 /var/log/gpuq-site/broker.log 2>/dev/null | sed 's/^/broker: /'
  for n in da1 da2 da3 da4; do tail -n 8 "$D/logs/$n-node.log" 2>/dev/null | sed "s/^/$n-node: /"; done
  exit 1
}
ok() { echo "SITE-CHECK $1 ok"; }
# What a process is doing, for a failure's message: its state and where
# each of its threads waits in the kernel.
proc_state() { # pid
  [ -d "/proc/$1" ] || { echo "process $1 is gone"; return; }
  echo "process $1: $(grep -E '^(State|Threads):' "/proc/$1/status" | tr '\n' ' ')"
  for t in /proc/"$1"/task/*; do echo "  thread ${t##*/} $(cat "$t/comm") waits in $(cat "$t/wchan")"; done
}
# Whether process PID runs. A zombie does not: an exited child of this
# shell stays one until the shell reaps it, and `kill -0` succeeds on a
# zombie. A broker stopped by SIGTERM "ran" until the limit: CI's stop-37
# failure (60 s then), and session 23 saw it with the 300 s limit:
# "State: Z (zombie)" — unreaped that long, though bash usually reaps at
# once; why is not known, so the state is read, not assumed.
alive() { # pid
  local l
  { read -r l <"/proc/$1/stat"; } 2>/dev/null || return 1
  l=${l##*) }
  [ "${l%% *}" != Z ]
}
# Until process PID has exited (failing WHAT after SECS, with what it is
# doing). The limits below are for failure only: under TCG on a busy host
# the guest stalls, and CI saw stalls of tens of seconds (docs/testing.md),
# so none is under a minute.
until_gone() { # pid secs what
  local end=$((SECONDS + $2))
  while alive "$1"; do
    [ $SECONDS -lt $end ] || fail "$3" "process $1 did not end within $2 s: $(proc_state "$1")"
    nap 0.1
  done
}
# Seconds since the previous mark (per-step lifecycle times,
# docs/benchmarks.md), and since the script began (where a step restarts
# its clock — `last=` — the untimed time between shows there).
mark() { now=$(date +%s.%N); echo "SITE-TIME $1 $(awk -v a="$last" -v b="$now" -v t="$T0" 'BEGIN{printf "%.1f (at %.0f s)", b-a, b-t}')"; last=$now; }
# A wait without a process: under TCG each fork and exec costs ~40 ms of
# emulated CPU (docs/testing.md, "Time"), and the polls below run for
# minutes. read(1) on a FIFO no one writes to times out in the shell itself.
NAP_FIFO=$(mktemp -u /tmp/site-nap.XXXXXX)
mkfifo -m 600 "$NAP_FIFO"
exec 9<>"$NAP_FIFO"
rm -f "$NAP_FIFO"
nap() { read -r -t "$1" -u 9 _ || true; }
# The harness's own waits (integration/cluster/lib.sh) poll less often
# here, and wait as long as this script's own (a guest starved of host CPU
# brought up five Podman services and four sshds so slowly that a node's
# banner took over 5 s: cluster-up failed on the old 5 s connect limit).
export GPUQ_CLUSTER_POLL_MS=250 GPUQ_CLUSTER_WAIT_SECS=300 GPUQ_CLUSTER_SSH_CONNECT_SECS=60
field() { printf '%s\n' "$1" | sed -n "s/^ *\"$2\": *\"\{0,1\}\([^,\"]*\)\"\{0,1\},\{0,1\}$/\1/p" | head -n1; }
as_alice() { (cd /w/alice && setpriv --reuid=61001 --regid=61001 --init-groups env HOME=/w/alice GPUQ_SOCKET=/run/gpuq-site/broker.sock "$@"); }
gq() { GPUQ_SOCKET=/run/gpuq-site/broker.sock gpuq "$@"; }
wait_state() { # id state secs
  end=$(( $(date +%s) + $3 ))
  while :; do
    # The job's state without a pipeline (field's printf | sed | head).
    j=$(gq status "$1" --json); s=""
    [[ $j =~ \"state\":\ *\"([a-z_]+)\" ]] && s=${BASH_REMATCH[1]}
    [ "$s" = "$2" ] && return 0
    case "$s" in completed|failed|cancelled|timeout) [ "$s" = "$2" ] || fail "wait-$2" "job $1 ended '$s': $j; log: $(cat "$(field "$j" log_path)" 2>/dev/null | tail -20)";; esac
    [ "$(date +%s)" -lt "$end" ] || fail "wait-$2" "job $1 is '$s' after $3 s, not $2: $j"
    nap 0.5
  done
}

# Everything of ours in the guest ends here (the guest itself is thrown away).
finish() {
  kill "$(cat /var/lib/gpuq-site/broker.pid)" 2>/dev/null || true
  GPUQ_CLUSTER_DIR=$D timeout 300 "$F/integration/cluster/down" >/var/log/gpuq-site/cluster-down.log 2>&1 \
    || fail cluster-down "$(tail -n 20 /var/log/gpuq-site/cluster-down.log)"
  mark cluster-down
  echo "SITE-TIME total $(awk -v a="$T0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')"
  echo "SITE-DONE"
  exit 0
}
# Until the active lease is released (failing WHAT if it is held, or
# still there after SECS).
wait_released() { # what secs
  i=0; while [ -e $state_dir/active.json ]; do
    i=$((i+1)); [ $i -lt $(($2 * 2)) ] || fail "$1" "lease not released after $2 s"
    [ -e $state_dir/blocked.json ] && fail "$1" "held: $(cat $state_dir/blocked.json)"
    nap 0.5
  done
}

# The namespace of controller SERIAL with NSID, e.g. /dev/nvme2n1.
dev_of() { # serial nsid
  for c in /sys/class/nvme/nvme*; do
    [ "$(tr -d ' ' <"$c/serial")" = "$1" ] || continue
    for ns in /sys/block/"$(basename "$c")"n*; do
      [ "$(cat "$ns/nsid" 2>/dev/null || cat "$ns/device/../$(basename "$ns")/nsid" 2>/dev/null)" = "$2" ] && { echo "/dev/$(basename "$ns")"; return 0; }
    done
  done
  return 1
}
# "node serial pci nsid" for every allowlisted namespace.
ALLOW="da1 SN-SITE-0001 0000:00:11.0 1
da2 SN-SITE-0002 0000:00:12.0 1
da3 SN-SITE-0003 0000:00:13.0 1
da4 SN-SITE-0005 0000:00:15.0 1
da4 SN-SITE-0005 0000:00:15.0 2"
BYSTANDER=$(dev_of SN-SITE-0004 1) || fail setup "no SN-SITE-0004"
at() { dd if="$1" bs=4096 skip=$(( $2 / 4096 )) count=$(( ($3 + 4095) / 4096 )) status=none | head -c "$3"; }
zero_range() { cmp -s -n "$3" <(dd if="$1" bs=4096 skip=$(( $2 / 4096 )) count=$(( $3 / 4096 )) status=none) /dev/zero; }

# --- devices: all zero before anything ---------------------------------------
echo "$ALLOW" | while read -r n s p i; do
  d=$(dev_of "$s" "$i") || fail setup "$n: no $s nsid $i"
  zero_range "$d" 0 $((8 << 20)) || fail setup "$d is not zero before the test"
done
zero_range "$BYSTANDER" 0 $((8 << 20)) || fail setup "$BYSTANDER is not zero before the test"

# --- the cluster, physical profile -------------------------------------------
# POST BODY (JSON) to a node helper's PATH through its socket, as the
# broker's link does; the answer in /tmp/ask.out, the HTTP status printed.
#   ask_node NODE PATH BODY
ask_node() {
  curl -sS --max-time 60 -o /tmp/ask.out -w '%{http_code}' --unix-socket "$D/$1/run/node.sock" \
    -X POST -H 'content-type: application/json' -d "$3" "http://node$2"
}
# A node's lease record and what its lease directory holds (owners, modes,
# names): what a refused call must leave as it was.
node_lease_state() { md5sum <"$D/$1/jobs/lease.json"; find "$D/$1/jobs/$2" -maxdepth 3 -printf '%u %m %p\n' | sort; }
# A node helper's PID, as the cluster recorded it.
helper_pid() { awk -v h="$1" '$1 == "pid" && $2 == h && $3 == "node" {print $4; exit}' "$D/manifest"; }
addr() { case $1 in da1) echo 10.200.0.11;; da2) echo 10.200.0.12;; da3) echo 10.200.0.13;; da4) echo 10.200.0.14;; esac; }
mkdir -p /etc/gpuq-site/devices /var/log/gpuq-site
for n in da1 da2 da3 da4; do
  {
    echo "$ALLOW" | while read -r nn s p i; do
      [ "$nn" = "$n" ] || continue
      printf '[[devices]]\nserial = "%s"\npci = "%s"\nnsid = %s\nsize_bytes = %s\n\n' "$s" "$p" "$i" "$NS_BYTES"
    done
    # The site's pre-existing DAOS service, as gpuq activate's plan sees it.
    if [ "$ALL" = 1 ]; then printf '[activation]\nunits = ["daos_server.service"]\n\n'; fi
    # --stor nvmeof (#18): this node's listener on its own address.
    if [ "$STOR" = 1 ]; then printf '[stor.nvmeof]\nkind = "nvmeof"\ntransport = "tcp"\naddress = "%s"\n\n' "$(addr "$n")"; fi
    # --stor nfsrdma: TCP here (no RDMA device in this guest).
    if [ "$NFS" = 1 ]; then printf '[stor.nfs]\nkind = "nfsrdma"\ntransport = "tcp"\naddress = "%s"\nmkfs_image = "%s"\n\n' "$(addr "$n")" "$(cat "$F/mkfs-image-id")"; fi
  } >"/etc/gpuq-site/devices/$n.toml"
done
IMAGE=$(cat "$F/image-id")
GPUQ_CLUSTER_DIR=$D GPUQ_CLUSTER_PREFIX=$P GPUQ_BIN_DIR=$F GPUQ_CLUSTER_IMAGE=$F/daos-sim-image.tar \
  GPUQ_CLUSTER_PROFILE_IMAGE=$IMAGE GPUQ_CLUSTER_PROFILE_NAME=inst1 GPUQ_CLUSTER_MODE=physical \
  GPUQ_CLUSTER_DEVICES_DIR=/etc/gpuq-site/devices \
  timeout 600 "$F/integration/cluster/up" >/var/log/gpuq-site/cluster-up.log 2>&1 \
  || fail cluster-up "$(tail -n 30 /var/log/gpuq-site/cluster-up.log)"
mark cluster-up
for n in da1 da2 da3 da4; do
  grep -q 'mode = "physical"' "$D/$n/etc/node.toml" || fail cluster-up "$n is not physical"
done
ok cluster-up-with-four-physical-nodes
if [ "$NFS" = 1 ]; then
  # The nodes' pinned mkfs image (integration/mkfs-image), through their
  # Podman APIs.
  GPUQ_CLUSTER_DIR=$D GPUQ_CLUSTER_PREFIX=$P "$F/integration/cluster/load-image" "$F/mkfs-image.tar" da1 da2 da3 da4 \
    >/var/log/gpuq-site/load-mkfs.log 2>&1 || fail load-mkfs "$(tail -n 20 /var/log/gpuq-site/load-mkfs.log)"
  [ "$(grep -c "^da[1-4] $(cat "$F/mkfs-image-id")" /var/log/gpuq-site/load-mkfs.log)" = 4 ] \
    || fail load-mkfs "not the pinned ID on all four: $(cat /var/log/gpuq-site/load-mkfs.log)"
fi

# --- the broker on cxl2 (systemd runner) ---------------------------------------
install -m 755 "$F/gpuq" /usr/local/bin/gpuq
# The systemd runner runs the broker's executable as each job's user: it
# must be root's, 0755, in root-only directories (the broker checks).
install -m 755 "$F/gpuq-broker" /usr/local/sbin/gpuq-broker
mkdir -p -m 755 /var/lib/gpuq-site /run/gpuq-site /var/log/gpuq-site/jobs
{
  cat <<TOML
[broker]
socket = "/run/gpuq-site/broker.sock"
state_dir = "/var/lib/gpuq-site/state"
log_root = "/var/log/gpuq-site/jobs"
maintenance_file = "/etc/gpuq-site/maintenance.json"
runner = "systemd"
gpu = "none"
default_time = "30m"
max_time = "1h"

[daos]
run_dir = "/var/lib/gpuq-site/daos"
podman_socket = "$D/cxl2/run/podman.sock"
forward_dir = "$D/cxl2/run/links"
identity_file = "$D/cxl2/ssh/id_ed25519"
known_hosts_file = "$D/ssh/known_hosts"
ssh_config_file = "$D/ssh/ssh_config"
join_timeout_secs = 120
link_timeout_secs = 120
ssh_connect_timeout_secs = 60
TOML
  for n in da1 da2 da3 da4; do
    printf '\n[[daos.nodes]]\nname = "%s"\nhost = "%s"\naddress = "%s"\nnode_socket = "%s"\npodman_socket = "%s"\n' \
      "$n" "$n" "$(addr $n)" "$D/$n/run/node.sock" "$D/$n/run/podman.sock"
  done
  printf '\n[daos.profiles.inst1]\nimage = "%s"\nreplicas = ["%s"]\n' "$IMAGE" "$(addr da1)"
  if [ "$STOR" = 1 ]; then printf '\n[daos.stor.nvmeof]\nkind = "nvmeof"\n'; fi
  if [ "$NFS" = 1 ]; then printf '\n[daos.stor.nfs]\nkind = "nfsrdma"\nclient_address = "10.200.0.10"\n'; fi
} >/etc/gpuq-site/broker.toml
chmod 644 /etc/gpuq-site/broker.toml
# start_broker [BINARY [CRASH_POINT]]: the shipped broker by default; the
# crash-points build (a test build that aborts at CRASH_POINT) for the
# --stor crash loop.
start_broker() {
  setsid nsenter --net=$NS_CXL2 env GPUQ_LOG=debug ${2:+GPUQ_CRASH_AT=$2} "${1:-/usr/local/sbin/gpuq-broker}" --config /etc/gpuq-site/broker.toml \
    </dev/null >>/var/log/gpuq-site/broker.log 2>&1 &
  echo $! >/var/lib/gpuq-site/broker.pid
  end=$((SECONDS + 300))
  until [ -S /run/gpuq-site/broker.sock ] && gq list >/dev/null 2>&1; do
    [ $SECONDS -lt $end ] || fail broker-start "no socket after 300 s: $(proc_state "$(cat /var/lib/gpuq-site/broker.pid)")"
    nap 0.5
  done
  # The four node links (one ssh master each; under TCG a master takes
  # ~7 s of the nodelink's fixed 5+2 s limit when all four connect at once,
  # so they may need a retry or two).
  i=0; until [ "$(gq daos-status | grep -Ec '^da[1-4] +up ')" = 4 ]; do
    i=$((i+1)); [ $i -lt 240 ] || fail broker-links "links not up after 120 s: $(gq daos-status 2>&1)"; nap 0.5
  done
}
start_broker
mark broker-start-links-up
ok broker-start

# --- what each node's kernel offers --stor (#18): this guest's Debian kernel
# has nvmet, nvmet-tcp, nfsd and xfs, and no Lustre server ---------------------
st=$(gq daos-status --json | tr -d ' \n')
rel=$(uname -r)
for k in nvmeof_target nfs_server; do
  [ "$(printf '%s' "$st" | grep -o "\"$k\":{\"available\":true" | wc -l)" = 4 ] \
    || fail stor-kernel "not every node reports $k available: $st"
done
[ "$(printf '%s' "$st" | grep -o '"lustre_server":{"available":false,"missing":"kernel[^"]*hasnolnet' | wc -l)" = 4 ] \
  || fail stor-kernel "not every node reports no Lustre server: $st"
jobs_before=$(gq list --all --json | grep -o '"id"' | wc -l)
r=$(cd /root && gq submit --stor lustre -- true 2>&1) && fail stor-lustre "submitted: $r"
[ "$(printf '%s\n' "$r" | wc -l)" = 1 ] || fail stor-lustre "not one line: $r"
printf '%s\n' "$r" | grep -qF "(da1, da2, da3, da4: kernel $rel has no lnet" || fail stor-lustre "$r"
[ "$(gq list --all --json | grep -o '"id"' | wc -l)" = "$jobs_before" ] || fail stor-lustre "a job was stored"
ok nodes-report-their-kernels-for-stor-and-stor-lustre-is-refused-in-one-line
mark stor-kernel

writes_of() { awk '{print "writes", $5, "sectors", $7, "discards", $12, "sectors", $14}' "/sys/block/$(basename "$1")/stat"; }
stats() { echo "$ALLOW" | while read -r n s p i; do d=$(dev_of "$s" "$i"); echo "$n $d $(awk '{print $5, $7, $12, $14}' "/sys/block/$(basename "$d")/stat")"; done; }
if [ "$ALL" = 1 ]; then
  # --- before any activation, physical mode refuses (#17 item 2) ----------------
  before=$(stats)
  idu=$(cd /root && gq submit --inst inst1 -- touch /root/unclaimed-ran) || fail unclaimed "submit"
  wait_state "$idu" failed 300
  ju=$(gq status "$idu" --json)
  [ "$(printf '%s\n' "$ju" | grep -o 'da[1-4]: unclaimed' | sort -u | wc -l)" = 4 ] \
    || fail unclaimed "not every node refused as unclaimed: $ju"
  [ ! -e /root/unclaimed-ran ] || fail unclaimed "the job ran"
  [ "$(stats)" = "$before" ] || fail unclaimed "device counters moved: $before -> $(stats)"
  wait_released unclaimed 300
  ok an-unclaimed-site-refuses-a-physical-job-and-touches-no-device
  mark unclaimed

  # --- gpuq activate: the plan (#17 item 1) ------------------------------------
  # What the site had before gpuq: an ext4 on da2's namespace.
  mkfs.ext4 -q -F "$(dev_of SN-SITE-0002 1)" || fail activate-plan "mkfs.ext4"
  # A pre-existing DAOS service, as a site has one before gpuq: a unit named
  # daos_server.service (here a sleep), enabled and running under systemd.
  printf '[Unit]\nDescription=stand-in for a site DAOS server\n[Service]\nExecStart=/bin/sleep infinity\n[Install]\nWantedBy=multi-user.target\n' \
    >/etc/systemd/system/daos_server.service
  systemctl daemon-reload
  systemctl enable --now -q daos_server.service || fail activate-plan "cannot start the stand-in daos_server.service"
  unit_pid=$(systemctl show -p MainPID --value daos_server.service)
  before=$(stats)
  rc=0; plan=$(gq activate --json) || rc=$?
  [ "$rc" = 0 ] || fail activate-plan "gpuq activate exited $rc: $plan"
  for s in SN-SITE-0001 SN-SITE-0002 SN-SITE-0003 SN-SITE-0005; do
    printf '%s\n' "$plan" | grep -q "serial $s" || fail activate-plan "no device with serial $s in the plan: $plan"
  done
  [ "$(printf '%s\n' "$plan" | grep -c '"active_state": "active"')" = 4 ] \
    || fail activate-plan "not every node saw daos_server.service active: $plan"
  [ "$(printf '%s\n' "$plan" | grep -c "\"main_pid\": $unit_pid")" = 4 ] \
    || fail activate-plan "not every node saw its main PID $unit_pid: $plan"
  printf '%s\n' "$plan" | grep -q "stop daos_server.service (active, main PID $unit_pid) and disable its start at boot (enabled)" \
    || fail activate-plan "no stop step for the unit: $plan"
  [ "$(printf '%s\n' "$plan" | grep -c 'discard all of /dev/nvme')" = 5 ] \
    || fail activate-plan "not five discard steps (da4 has two namespaces): $plan"
  # Nothing was changed: not a write or discard on any device, the unit
  # still running and enabled, no lease.
  [ "$(stats)" = "$before" ] || fail activate-plan "device counters moved: $before -> $(stats)"
  systemctl is-active -q daos_server.service && systemctl is-enabled -q daos_server.service \
    || fail activate-plan "the plan changed the unit"
  [ ! -e $state_dir/active.json ] || fail activate-plan "a plan made a lease"
  printf '%s\n' "$plan" | grep -q '"ext4 superblock' || fail activate-plan "da2's ext4 is not in the plan: $plan"
  ok activate-plan-shows-devices-and-the-running-unit-and-changes-nothing
  mark activate-plan

  # --- an activation with da3's helper gone: held, and resumed (#17 item 4) ------
  # da3's helper is killed (SIGKILL, by the PID the cluster recorded); the
  # activation claims the other three, keeps the `activating` hold and
  # exits 1; `recover` refuses and points at the activation. da3's helper
  # comes back (as its unit's Restart= would start it: same command, same
  # namespace; the manifest gets its new PID so `down` ends it), and the
  # second run below finishes da3 only.
  old=$(awk '$1 == "pid" && $2 == "da3" && $3 == "node" {print $4; exit}' "$D/manifest")
  mapfile -d '' -t cmd <"/proc/$old/cmdline"
  kill -9 "$old"
  until_gone "$old" 120 activate-held
  rc=0; held=$(gq activate --execute --destroy-existing-data) || rc=$?
  [ "$rc" = 1 ] || fail activate-held "exit $rc with da3's helper gone: $held"
  printf '%s\n' "$held" | grep -A1 '^da3:$' | grep -q 'NOT COMPLETE' || fail activate-held "da3 not named: $held"
  grep -q '"kind": "activating"' $state_dir/blocked.json || fail activate-held "no activating hold: $(cat $state_dir/blocked.json 2>&1)"
  for n in da1 da2 da4; do [ -e "$D/$n/jobs/claim.json" ] || fail activate-held "$n not claimed: $held"; done
  [ ! -e "$D/da3/jobs/claim.json" ] || fail activate-held "da3 claimed without its helper"
  rc=0; r=$(gq recover 2>&1) || rc=$?
  [ "$rc" != 0 ] && printf '%s\n' "$r" | grep -q 'gpuq activate --execute' || fail activate-held "recover: exit $rc: $r"
  GPUQ_LOG=info setsid nsenter --net=/run/netns/$P-da3 "${cmd[@]}" </dev/null >>"$D/logs/da3-node.log" 2>&1 &
  new=$!
  sed -i "s/^pid da3 node $old\$/pid da3 node $new/" "$D/manifest"
  i=0; until [ -S "$D/da3/run/node.sock" ] && [ "$(stat -c %Y "$D/da3/run/node.sock")" -ge "$(stat -c %Y /proc/$new)" ]; do
    i=$((i+1)); [ $i -lt 200 ] || fail activate-held "da3's helper did not come back"; nap 0.1
  done
  ok an-activation-with-a-node-gone-holds-claims-the-others-and-recover-refuses
  mark activate-held

  # --- gpuq activate --execute (#17 item 2): the second run finishes -----------
  rc=0; done_json=$(gq activate --execute --destroy-existing-data --json) || rc=$?
  [ "$rc" = 0 ] || fail activate-execute "gpuq activate --execute exited $rc: $done_json"
  printf '%s\n' "$done_json" | grep -q '"held"' && fail activate-execute "held: $done_json"
  # The unit: stopped and disabled by systemd (asked over D-Bus by each node).
  ! systemctl is-active -q daos_server.service || fail activate-execute "daos_server.service still active"
  [ "$(systemctl is-enabled daos_server.service 2>/dev/null)" = disabled ] \
    || fail activate-execute "daos_server.service is $(systemctl is-enabled daos_server.service 2>&1), not disabled"
  ! kill -0 "$unit_pid" 2>/dev/null || fail activate-execute "the unit's process $unit_pid still runs"
  # Every allowlisted namespace discarded (one more discard each) and zero;
  # the ext4 gone; the namespace on no allowlist untouched.
  after=$(stats)
  echo "$ALLOW" | while read -r n s p i; do
    d=$(dev_of "$s" "$i")
    b=$(printf '%s\n' "$before" | awk -v d="$d" '$2 == d {print $5}')
    a=$(printf '%s\n' "$after" | awk -v d="$d" '$2 == d {print $5}')
    [ "$a" -gt "$b" ] || fail activate-execute "$n $d: discards $b -> $a"
    zero_range "$d" 0 $((8 << 20)) || fail activate-execute "$n $d is not zero after the activation"
  done
  [ -z "$(blkid -p "$(dev_of SN-SITE-0002 1)" 2>/dev/null)" ] || fail activate-execute "da2's ext4 survived"
  zero_range "$BYSTANDER" 0 $((8 << 20)) || fail activate-execute "$BYSTANDER was written"
  # Claims and audit records on every node.
  for n in da1 da2 da3 da4; do
    [ "$(stat -c %a "$D/$n/jobs/claim.json" 2>/dev/null)" = 600 ] || fail activate-execute "$n has no root-only claim"
    grep -q '"activation": "activation-' "$D/$n/jobs/claim.json" || fail activate-execute "$n: $(cat "$D/$n/jobs/claim.json")"
    grep -qs '"reason": "activation"' "$D/$n"/jobs/activation-*/wipe-*.json || fail activate-execute "$n has no activation audit record"
  done
  grep -qs 'ext4' "$D/da2"/jobs/activation-*/wipe-*.json || fail activate-execute "da2's audit does not name the ext4 it destroyed"
  [ "$(grep -c 'SN-SITE-000' "$D/da4/jobs/claim.json")" = 2 ] || fail activate-execute "da4 does not claim both namespaces: $(cat "$D/da4/jobs/claim.json")"
  [ ! -e $state_dir/blocked.json ] || fail activate-execute "the hold stayed: $(cat $state_dir/blocked.json)"
  # Resumed: the three claimed nodes did nothing again, da3 did its part.
  [ "$(printf '%s\n' "$done_json" | grep -c '"already_claimed": true')" = 3 ] \
    || fail activate-execute "not three nodes already claimed: $done_json"
  [ "$(cat "$D"/da*/jobs/claim.json | grep -o '"activation": "activation-[0-9]*"' | sort -u | wc -l)" = 1 ] \
    || fail activate-execute "the claims name more than one activation"
  ok activate-execute-stops-and-disables-the-unit-discards-and-claims-every-node
  systemctl disable --now -q daos_server.service
  rm -f /etc/systemd/system/daos_server.service
  systemctl daemon-reload
  mark activate-execute

  # --- gpuq e2e on the physical site (#17 item 3) --------------------------------
  rc=0; e2e=$(gq e2e 2>&1) || rc=$?
  [ "$rc" = 1 ] && printf '%s\n' "$e2e" | grep -q 'maintenance lock' || fail e2e "e2e without the lock: exit $rc: $e2e"
  gq lock --reason e2e >/dev/null 2>&1 || fail e2e "gpuq lock"
  rc=0; e2e=$(gq e2e 2>&1) || rc=$?
  gq unlock >/dev/null 2>&1 || fail e2e "gpuq unlock"
  [ "$rc" = 0 ] || fail e2e "gpuq e2e exited $rc: $e2e"
  printf '%s\n' "$e2e" | tail -n 1 | grep -qx PASSED || fail e2e "not passed: $e2e"
  [ "$(printf '%s\n' "$e2e" | grep -cE 'device_discarded +ok .*wiped .*no signature after the discard')" = 5 ] \
    || fail e2e "not five namespaces discarded and clean: $e2e"
  [ "$(printf '%s\n' "$e2e" | grep -cE 'server_output_kept +ok')" = 4 ] || fail e2e "server output not kept on all four: $e2e"
  printf '%s\n' "$e2e" | grep -q 'test mode' && fail e2e "a physical site reported as test mode: $e2e"
  zero_range "$BYSTANDER" 0 $((8 << 20)) || fail e2e "$BYSTANDER was written"
  ok e2e-on-the-physical-site-writes-reads-back-and-finds-every-namespace-discarded
  mark e2e
else
  rc=0; done_json=$(gq activate --execute --destroy-existing-data --json) || rc=$?
  [ "$rc" = 0 ] || fail activate-execute "gpuq activate --execute exited $rc: $done_json"
  for n in da1 da2 da3 da4; do [ -e "$D/$n/jobs/claim.json" ] || fail activate-execute "$n not claimed"; done
  ok activate-execute
  mark activate-execute
fi

getent group 61001 >/dev/null || groupadd -g 61001 alice
id alice >/dev/null 2>&1 || useradd -u 61001 -g 61001 -M -d /w/alice -s /bin/sh alice
mkdir -p /w/alice && chown 61001:61001 /w/alice && chmod 700 /w/alice
printf 'gpuq site VM payload %s\n' "$(date +%s%N)" >/w/alice/payload
chown 61001:61001 /w/alice/payload
PAYLOAD=$(cat /w/alice/payload)

# --- stor-bench (integration/bench/stor-nvmeof.sh): one --stor nvmeof job's
# stand-up and cleanup, gpuq against the same steps by hand as the original
# did them: from cxl2, one ssh per node and step, configfs written by a
# shell (what nvmetcli does, without its checks), the connect written to
# /dev/nvme-fabrics (what `nvme connect` does), the devices chowned to the
# user, and at the end delete_controller, the configfs objects removed and
# `blkdiscard` of each namespace. No checks, no records, no audit: the
# difference is what gpuq's safety costs. Prints
# "STOR-BENCH gpuq|hand RUN standup S cleanup S".
if [ "${SITE_SCENARIOS:-all}" = stor-bench ]; then
  modprobe -a nvmet nvmet-tcp nvme-tcp || fail bench "modprobe"
  mountpoint -q /sys/kernel/config || mount -t configfs configfs /sys/kernel/config || fail bench "configfs"
  nsenter --net=$NS_CXL2 iptables -A OUTPUT -p tcp --dport 4420 -m owner --uid-owner 1-4294967294 \
    -j REJECT --reject-with tcp-reset || fail bench "iptables"
  nsh() { nsenter --net=$NS_CXL2 ssh -F "$D/ssh/ssh_config" -i "$D/cxl2/ssh/id_harness" "$@"; }
  tnow() { date +%s.%N; }
  dt() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.2f", b-a}'; }
  until_file() { # path secs what
    k=0; until [ -e "$1" ]; do k=$((k+1)); [ $k -lt $(($2 * 20)) ] || fail bench "$3"; nap 0.05; done
  }
  C=/sys/kernel/config/nvmet
  HOSTNQN=nqn.2026-12.org.bench:host
  HOSTID=6c0ae1e2-3d4b-4c5d-8e6f-708192a3b4c5
  for r in $(seq 1 "${STOR_BENCH_N:-5}"); do
    rm -f /w/alice/bench-ran
    t0=$(tnow)
    idb=$(as_alice gpuq submit --stor nvmeof -- touch /w/alice/bench-ran) || fail bench "submit"
    until_file /w/alice/bench-ran 300 "gpuq run $r: the job did not run: $(gq status "$idb" --json)"
    t1=$(tnow)
    k=0; while [ -e $state_dir/active.json ]; do
      [ ! -e $state_dir/blocked.json ] || fail bench "held: $(cat $state_dir/blocked.json)"
      k=$((k+1)); [ $k -lt 6000 ] || fail bench "not released"; nap 0.05
    done
    t2=$(tnow)
    echo "STOR-BENCH gpuq $r standup $(dt "$t0" "$t1") cleanup $(dt "$t1" "$t2")"

    rm -f /w/alice/bench-ran
    t0=$(tnow)
    port=100
    for n in da1 da2 da3 da4; do
      port=$((port + 1))
      S=$C/subsystems/nqn.2026-12.org.bench:$n
      cmds="set -e; mkdir $S; echo 0 >$S/attr_allow_any_host; ns=0"
      while read -r nn s p i; do
        [ "$nn" = "$n" ] || continue
        d=$(dev_of "$s" "$i")
        cmds="$cmds; ns=\$((ns+1)); mkdir $S/namespaces/\$ns; echo -n $d >$S/namespaces/\$ns/device_path; echo 1 >$S/namespaces/\$ns/enable"
      done <<<"$ALLOW"
      cmds="$cmds; mkdir -p $C/hosts/$HOSTNQN; ln -s $C/hosts/$HOSTNQN $S/allowed_hosts/$HOSTNQN"
      cmds="$cmds; mkdir $C/ports/$port; echo tcp >$C/ports/$port/addr_trtype; echo ipv4 >$C/ports/$port/addr_adrfam"
      cmds="$cmds; echo $(addr $n) >$C/ports/$port/addr_traddr; echo 4420 >$C/ports/$port/addr_trsvcid; ln -s $S $C/ports/$port/subsystems/"
      nsh "$n" "$cmds" || fail bench "by hand: export on $n"
    done
    for n in da1 da2 da3 da4; do
      nsenter --net=$NS_CXL2 bash -c "exec 3<>/dev/nvme-fabrics; printf 'transport=tcp,traddr=$(addr $n),trsvcid=4420,nqn=nqn.2026-12.org.bench:$n,hostnqn=$HOSTNQN,hostid=$HOSTID' >&3; read -r l <&3" \
        || fail bench "by hand: connect to $n"
    done
    k=0; until [ "$(cat /sys/class/nvme-subsystem/*/subsysnqn | grep -c '^nqn.2026-12.org.bench:da')" = 4 ] \
      && [ "$(for x in /sys/class/nvme-subsystem/*; do grep -q '^nqn.2026-12.org.bench:' "$x/subsysnqn" && ls "$x"; done | grep -c '^nvme[0-9]*n[0-9]*$')" = 5 ]; do
      k=$((k+1)); [ $k -lt 2000 ] || fail bench "by hand: not five devices"; nap 0.05
    done
    bdevs=$(for x in /sys/class/nvme-subsystem/*; do grep -q '^nqn.2026-12.org.bench:' "$x/subsysnqn" && ls "$x"; done | grep '^nvme[0-9]*n[0-9]*$' | sed 's|^|/dev/|')
    # shellcheck disable=SC2086
    chown 61001 $bdevs
    as_alice touch /w/alice/bench-ran
    t1=$(tnow)
    for c in /sys/class/nvme/nvme*; do
      if grep -q '^nqn.2026-12.org.bench:' "$c/subsysnqn"; then echo 1 >"$c/delete_controller"; fi
    done
    port=100
    for n in da1 da2 da3 da4; do
      port=$((port + 1))
      S=$C/subsystems/nqn.2026-12.org.bench:$n
      cmds="set -e; rm $C/ports/$port/subsystems/nqn.2026-12.org.bench:$n; rmdir $C/ports/$port"
      cmds="$cmds; for x in $S/namespaces/*; do rmdir \$x; done; rm $S/allowed_hosts/$HOSTNQN; rmdir $S"
      [ "$n" = da4 ] && cmds="$cmds; rmdir $C/hosts/$HOSTNQN"
      while read -r nn s p i; do
        [ "$nn" = "$n" ] || continue
        cmds="$cmds; blkdiscard -f $(dev_of "$s" "$i")"
      done <<<"$ALLOW"
      nsh "$n" "$cmds" || fail bench "by hand: cleanup on $n"
    done
    t2=$(tnow)
    [ -z "$(find $C -mindepth 2 -maxdepth 2)" ] || fail bench "by hand left: $(find $C -mindepth 2 -maxdepth 2)"
    echo "STOR-BENCH hand $r standup $(dt "$t0" "$t1") cleanup $(dt "$t1" "$t2")"
  done
  modprobe -r nvme-tcp nvmet-tcp nvmet || true
  finish
fi

# The crash-point loop of a --stor profile (lifecycle.md, "Crash points"):
# the broker's test build aborts (as kill -9) right after the state of
# each point is durable; a restarted broker must find the lease clean or
# held, never dirty: preparing points hold (the job is lost, `recover`
# finishes), cleanup points resume at their step and release. Each
# crashed broker is followed by the crash-points build armed at the next
# point, which must not be on the rest of the previous lease's path: give
# the cleanup points backwards, then the preparing ones (no cleanup passes
# those). One broker start per point under TCG, not two.
#   crash_chain PROFILE LEFT_FN POINT...
crash_chain() {
  cp_profile=$1; cp_left=$2; shift 2
  install -m 755 "$F/gpuq-broker-crash-points" /usr/local/sbin/gpuq-broker-crash-points
  bp=$(cat /var/lib/gpuq-site/broker.pid)
  last=$(date +%s.%N)
  kill "$bp"; until_gone "$bp" 300 "crash-$cp_profile-broker-stop"
  mark "$cp_profile-broker-sigterm-to-exit"
  rm -f /run/gpuq-site/broker.sock
  prev=""; idp=""
  for point in "$@" ""; do
    last=$(date +%s.%N)
    if [ -n "$point" ]; then start_broker /usr/local/sbin/gpuq-broker-crash-points "$point"; else start_broker; fi
    bp=$(cat /var/lib/gpuq-site/broker.pid)
    case $prev in
      "") ;;
      before_*)
        [ ! -e $state_dir/blocked.json ] || fail "crash-$cp_profile-$prev" "held: $(cat $state_dir/blocked.json)"
        wait_state "$idp" completed 120 ;;
      *)
        [ -e $state_dir/blocked.json ] || fail "crash-$cp_profile-$prev" "not held after a crash while preparing"
        wait_state "$idp" lost 300
        out=$(gq recover 2>&1) || fail "crash-$cp_profile-$prev" "recover: $out" ;;
    esac
    if [ -n "$prev" ]; then
      wait_released "crash-$cp_profile-$prev" 300
      mark "$cp_profile-crash-$prev-to-released"
      [ -z "$($cp_left)" ] || fail "crash-$cp_profile-$prev" "left: $($cp_left)"
      for a in $(echo "$ALLOW" | awk '{print $2 ":" $4}'); do
        zero_range "$(dev_of "${a%%:*}" "${a##*:}")" 0 $((1 << 20)) || fail "crash-$cp_profile-$prev" "${a%%:*} not zero"
      done
    fi
    [ -n "$point" ] || break
    idp=$(as_alice gpuq submit --stor "$cp_profile" -- true) || fail "crash-$cp_profile-$point" "submit"
    until_gone "$bp" 300 "crash-$cp_profile-$point: the broker did not abort at $point"
    rm -f /run/gpuq-site/broker.sock
    prev=$point
  done
}

# kill -9 of the broker while a --stor job runs: alice submits SCRIPT,
# and once it has written (FILE appears) the broker is killed and started
# again; the job must be re-adopted, not held. Its ID is left in RO_ID
# (not printed: the restarted broker must not be a command
# substitution's child).
#   readopt PROFILE SCRIPT FILE WHAT
readopt() {
  RO_ID=$(as_alice gpuq submit --stor "$1" -- "$2") || fail "$4" "submit"
  i=0; until [ -e "$3" ]; do
    i=$((i+1)); [ $i -lt 600 ] || fail "$4" "the job wrote nothing after 300 s: $(gq status "$RO_ID" --json)"; nap 0.5
  done
  kill -9 "$(cat /var/lib/gpuq-site/broker.pid)"
  start_broker
  [ ! -e $state_dir/blocked.json ] || fail "$4" "held: $(cat $state_dir/blocked.json)"
  grep -q "re-adopted by a restarted broker" "$(field "$(gq status "$RO_ID" --json)" log_path)" \
    || fail "$4" "not re-adopted: $(tail -5 "$(field "$(gq status "$RO_ID" --json)" log_path)")"
}

# --- scenario 5: --stor nfsrdma (#18), over TCP (no RDMA device here) ---------
# What an nfsrdma lease leaves behind on this host and the nodes: nothing
# (no NFS mount, no mount of a lease's filesystem, no NFS listener, no
# record).
nfs_left() {
  findmnt -rn -t nfs4 -o TARGET,SOURCE | sed 's/^/nfs mount /'
  findmnt -rn -o TARGET | grep -E "^$D/da[1-4]/jobs/" | sed 's/^/node mount /'
  for h in da1 da2 da3 da4; do
    nsenter --net=/run/netns/$P-$h ss -ltnH | grep -q ':2049 ' && echo "$h: NFS listener"
    [ ! -e "$D/$h/jobs/lease.json" ] || echo "$h: lease.json"
  done
}
stor_nfs() {
  # The operator loads the kernel NFS server (modules-load.d at boot).
  modprobe nfsd || fail nfs "modprobe nfsd"
  # A foreign NFS server on da3 (someone's, listening on 2049 in its
  # namespace): the preflight refuses, and nothing is made anywhere.
  fx=$(mktemp -d /tmp/foreign-nfsd.XXXXXX)
  nsenter --net=/run/netns/$P-da3 sh -c "mount -t nfsd nfsd $fx && echo -3 >$fx/versions && echo 'tcp 2049' >$fx/portlist && echo 2 >$fx/threads" \
    || fail nfs-foreign "start a foreign nfsd on da3"
  before=$(stats)
  idf=$(as_alice gpuq submit --stor nfs -- touch /w/alice/ran) || fail nfs-foreign "submit"
  wait_state "$idf" failed 300
  wait_released nfs-foreign 120
  jf=$(gq status "$idf" --json)
  printf '%s' "$jf" | grep -q 'da3.*port 2049 (the NFS listener.s) is already listening' || fail nfs-foreign "no refusal naming da3's port: $jf"
  [ ! -e /w/alice/ran ] || fail nfs-foreign "the job ran"
  [ "$(stats)" = "$before" ] || fail nfs-foreign "device counters moved: $before -> $(stats)"
  nsenter --net=/run/netns/$P-da3 sh -c "echo 0 >$fx/threads && umount $fx" || fail nfs-foreign "stop the foreign nfsd"
  rmdir "$fx"
  [ -z "$(nfs_left)" ] || fail nfs-foreign "left: $(nfs_left)"
  ok stor-nfsrdma-preflight-refuses-a-node-whose-nfs-port-is-taken-and-touches-nothing

  # alice's job writes a file on every filesystem it was given and waits;
  # meanwhile another user cannot list or read them, the nodes' own
  # filesystems hold the files, and each server admits cxl2 alone.
  cat >/w/alice/nfs.sh <<'JOB'
#!/bin/sh
set -e
echo "$GPUQ_STOR_MOUNTS" >/w/alice/nfs-mounts
env | grep '^GPUQ_STOR_MOUNTS_' | sort >/w/alice/nfs-per-node
for m in $GPUQ_STOR_MOUNTS; do
  printf 'alice-was-here %s\n' "$m" >"$m/alice-file"
  dd if=/dev/zero of="$m/alice-data" bs=1M count=4 conv=fsync status=none
done
touch /w/alice/nfs-written
i=0; while [ ! -e /w/alice/nfs-go ] && [ $i -lt 600 ]; do sleep 0.2; i=$((i+1)); done
for m in $GPUQ_STOR_MOUNTS; do cat "$m/alice-file" >/dev/null; done
touch /w/alice/nfs-read-again
JOB
  chown 61001:61001 /w/alice/nfs.sh; chmod 755 /w/alice/nfs.sh
  rm -f /w/alice/nfs-*
  last=$(date +%s.%N)
  idn=$(as_alice gpuq submit --stor nfs -- /w/alice/nfs.sh) || fail nfs "submit"
  i=0; until [ -e /w/alice/nfs-written ]; do
    i=$((i+1)); [ $i -lt 600 ] || fail nfs "the job wrote nothing after 300 s: $(gq status "$idn" --json); $(cat "$(field "$(gq status "$idn" --json)" log_path)")"
    nap 0.5
  done
  mark nfs-submit-to-written
  mounts=$(cat /w/alice/nfs-mounts)
  [ "$(echo $mounts | wc -w)" = 5 ] || fail nfs "not five filesystems (da4 has two): $mounts"
  [ "$(wc -l </w/alice/nfs-per-node)" = 4 ] || fail nfs "not one variable per node: $(cat /w/alice/nfs-per-node)"
  grep -q '^GPUQ_STOR_MOUNTS_DA4=[^ ]* [^ ]*$' /w/alice/nfs-per-node || fail nfs "da4 not two mounts: $(cat /w/alice/nfs-per-node)"
  for m in $mounts; do
    findmnt -rn -t nfs4 "$m" >/dev/null || fail nfs "$m is not an NFSv4 mount: $(findmnt -rn "$m")"
    findmnt -rn -o OPTIONS "$m" | grep -q 'vers=4.2' || fail nfs "$m is not NFSv4.2: $(findmnt -rn -o OPTIONS "$m")"
    [ "$(stat -c '%u %a' "$m")" = "61001 700" ] || fail nfs "$m is $(stat -c '%u %a' "$m"), not alice's 700"
    setpriv --reuid=61002 --regid=61002 --clear-groups ls "$m" >/dev/null 2>&1 && fail nfs "another user listed $m"
    setpriv --reuid=61002 --regid=61002 --clear-groups cat "$m/alice-file" >/dev/null 2>&1 && fail nfs "another user read $m/alice-file"
    # root on this host is squashed to nobody on the server.
    cat "$m/alice-file" >/dev/null 2>&1 && fail nfs "root on cxl2 read $m/alice-file (not squashed)"
  done
  L=$(sed -n 's/.*"lease": *"\([^"]*\)".*/\1/p' $state_dir/active.json | head -n1)
  for n in da1 da2 da3 da4; do
    # The node's own XFS holds alice's file, as alice's.
    nf=$(find "$D/$n/jobs/$L/nfs" -mindepth 2 -maxdepth 2 -name alice-file | wc -l)
    [ "$nf" -ge 1 ] || fail nfs "$n: no alice-file in its filesystems"
    for f in $(find "$D/$n/jobs/$L/nfs" -mindepth 2 -maxdepth 2 -name alice-file); do
      [ "$(stat -c %u "$f")" = 61001 ] || fail nfs "$f is not alice's"
      findmnt -rn -t xfs "$(dirname "$f")" >/dev/null || fail nfs "$(dirname "$f") is not an XFS mount"
    done
    # The server listens on the node's address alone, in its namespace.
    nsenter --net=/run/netns/$P-$n ss -ltnH | grep -q "$(addr $n):2049 " || fail nfs "$n: no listener on $(addr $n):2049"
    # Its client cache gives a domain to cxl2's address alone.
    dom=$(nsenter --net=/run/netns/$P-$n cat /proc/net/rpc/auth.unix.ip/content | grep -v '^#')
    printf '%s\n' "$dom" | grep -q "10.200.0.10 gpuq-$L" || fail nfs "$n: cxl2 has no domain: $dom"
    [ "$(printf '%s\n' "$dom" | grep -c gpuq-)" = 1 ] || fail nfs "$n: a domain for another client: $dom"
  done
  ss -ltnH | grep -q ':2049 ' && fail nfs "an NFS listener in the guest's own namespace"
  ok stor-nfsrdma-job-writes-its-four-nodes-filesystems-as-the-user-and-another-user-cannot-read-them
  # The export asked again for the same client and owner (the broker's
  # retry after a link was re-made mid-call): the same answer, nothing
  # made twice. For another owner: refused (409), nothing changed.
  st0=$(node_lease_state da2 "$L")
  code=$(ask_node da2 "/v1/leases/$L/nfs-export" '{"profile":"nfs","client_address":"10.200.0.10","owner_uid":61001,"owner_gid":61001}') || true
  [ "$code" = 200 ] || fail nfs-again "asked again: $code $(cat /tmp/ask.out)"
  grep -q "\"lease\": *\"$L\"" /tmp/ask.out && grep -q '"fsid"' /tmp/ask.out || fail nfs-again "not the export's report: $(cat /tmp/ask.out)"
  code=$(ask_node da2 "/v1/leases/$L/nfs-export" '{"profile":"nfs","client_address":"10.200.0.10","owner_uid":61002,"owner_gid":61002}') || true
  [ "$code" = 409 ] || fail nfs-again "another owner: $code $(cat /tmp/ask.out)"
  grep -q "already exported on this node" /tmp/ask.out || fail nfs-again "not the refusal: $(cat /tmp/ask.out)"
  [ "$(node_lease_state da2 "$L")" = "$st0" ] || fail nfs-again "da2 changed: $st0 -> $(node_lease_state da2 "$L")"
  ok stor-nfsrdma-an-export-asked-again-answers-the-same-and-for-another-owner-is-refused-changing-nothing
  # alice, outside her job, keeps a file of da1's mount open (a login
  # shell's `tail`): the cleanup ends that process (hers: only the owner
  # reaches inside the mounts) instead of holding the site.
  m1=$(sed -n 's/^GPUQ_STOR_MOUNTS_DA1=//p' /w/alice/nfs-per-node)
  as_alice sh -c "exec sleep 100000 <'$m1/alice-file'" &
  outside=$!
  touch /w/alice/nfs-go
  wait_state "$idn" completed 120
  [ -e /w/alice/nfs-read-again ] || fail nfs "the job could not read its files again"
  last=$(date +%s.%N)
  wait_released nfs 300
  mark nfs-job-end-to-released
  logn=$(cat "$(field "$(gq status "$idn" --json)" log_path)")
  echo "$logn" | grep -q 'NFS over TCP' || fail nfs "the log does not say TCP: $logn"
  for st in unmount unexport wipe; do echo "$logn" | grep -q "cleanup $st: " || fail nfs "no cleanup $st in: $logn"; done
  echo "$logn" | grep -q "ended what still held them: pid [0-9]* (sleep, uid 61001)" \
    || fail nfs "the unmount did not end alice's process outside the job: $logn"
  until_gone "$outside" 120 nfs-outside
  ok stor-nfsrdma-the-owners-process-still-holding-a-mount-after-the-job-is-ended-not-the-site-held
  [ -z "$(nfs_left)" ] || fail nfs "left: $(nfs_left)"
  for m in $mounts; do [ ! -e "$m" ] || fail nfs "$m still exists"; done
  echo "$ALLOW" | while read -r n s p i; do
    d=$(dev_of "$s" "$i")
    zero_range "$d" 0 $((1 << 20)) || fail nfs "$n $d is not zero after the wipe"
    out=$(blkid -p "$d" 2>&1) && fail nfs "$n $d: blkid still finds: $out"
    for st in mkfs export unexport wipe; do
      grep "\"step\":\"$st\"" "$D/$n/jobs/$L/audit.jsonl" | grep -q '"result":"ok"' \
        || fail nfs "$n: no $st ok in $D/$n/jobs/$L/audit.jsonl: $(cat "$D/$n/jobs/$L/audit.jsonl")"
    done
  done
  ok stor-nfsrdma-cleanup-unmounts-unexports-wipes-and-the-files-are-gone
  sed 's/^/SITE-LOG /' <<<"$logn"

  # Cancelled during its stand-up: cleaned and released, nothing left.
  last=$(date +%s.%N)
  idc=$(as_alice gpuq submit --stor nfs -- sleep 600) || fail nfs-cancel "submit"
  i=0; until grep -q 'exported on 4 nodes' "$(field "$(gq status "$idc" --json)" log_path)" 2>/dev/null; do
    i=$((i+1)); [ $i -lt 600 ] || fail nfs-cancel "not exported after 300 s: $(gq status "$idc" --json)"; nap 0.5
  done
  as_alice gpuq cancel "$idc" >/dev/null || fail nfs-cancel "gpuq cancel"
  wait_state "$idc" cancelled 120
  wait_released nfs-cancel 300
  mark nfs-cancel-to-released
  [ -z "$(nfs_left)" ] || fail nfs-cancel "left: $(nfs_left)"
  ok stor-nfsrdma-cancel-during-stand-up-cleans-and-releases

  # kill -9 while the job runs: the restarted broker re-adopts it (its
  # mounts stay), waits for its end, then cleans up.
  rm -f /w/alice/nfs-go /w/alice/nfs-written /w/alice/nfs-read-again
  last=$(date +%s.%N)
  readopt nfs /w/alice/nfs.sh /w/alice/nfs-written nfs-readopt
  idk=$RO_ID
  # da2's node helper killed (SIGKILL) and started again while the lease
  # is exported: the kernel server and the mounts outlive it, and the new
  # helper answers the server's upcalls again (resume_nfs). With da2's
  # export caches flushed, alice's file there is read only through new
  # upcalls: without an answer the hard mount would hang (bounded here).
  hp=$(helper_pid da2)
  hbin=$(readlink "/proc/$hp/exe")
  nlog=$D/logs/da2-node.log
  said='answering the NFS upcalls of the lease exported here again'
  n0=$(grep -c "$said" "$nlog" || true)
  kill -9 "$hp"
  until_gone "$hp" 120 nfs-resume
  last=$(date +%s.%N)
  GPUQ_LOG=info setsid nsenter --net=/run/netns/$P-da2 "$hbin" --config "$D/da2/etc/node.toml" serve \
    </dev/null >>"$nlog" 2>&1 &
  np=$!
  sed -i "s/^pid da2 node $hp\$/pid da2 node $np/" "$D/manifest"
  [ "$(helper_pid da2)" = "$np" ] || fail nfs-resume "the manifest does not name the new helper $np"
  i=0; until [ "$(grep -c "$said" "$nlog" || true)" -gt "$n0" ]; do
    i=$((i+1)); [ $i -lt 300 ] || fail nfs-resume "the restarted helper did not resume the export: $(tail -5 "$nlog")"; nap 0.2
  done
  mark nfs-helper-restart-to-resumed
  nsenter --net=/run/netns/$P-da2 sh -c 'for c in auth.unix.ip nfsd.fh nfsd.export; do date +%s >/proc/net/rpc/$c/flush; done' \
    || fail nfs-resume "flush da2's export caches"
  m2=$(sed -n 's/^GPUQ_STOR_MOUNTS_DA2=//p' /w/alice/nfs-per-node)
  [ -n "$m2" ] || fail nfs-resume "no da2 mount in $(cat /w/alice/nfs-per-node)"
  for m in $m2; do
    as_alice timeout -s KILL 60 cat "$m/alice-file" >/dev/null \
      || fail nfs-resume "alice cannot read $m/alice-file after da2's helper restarted: $(tail -5 "$nlog")"
    as_alice timeout -s KILL 60 sh -c "echo after-resume >'$m/after-resume'" \
      || fail nfs-resume "alice cannot write in $m after da2's helper restarted"
  done
  mark nfs-read-after-resume
  ok stor-nfsrdma-a-node-helper-restarted-while-exported-answers-its-server-again
  touch /w/alice/nfs-go
  wait_state "$idk" completed 120
  [ -e /w/alice/nfs-read-again ] || fail nfs-readopt "the job could not read its files after the restart"
  wait_released nfs-readopt 300
  mark nfs-kill-9-running-to-released
  [ -z "$(nfs_left)" ] || fail nfs-readopt "left: $(nfs_left)"
  ok stor-nfsrdma-kill-9-while-the-job-runs-is-re-adopted-and-cleaned

  # A busy mount on a node holds the lease at `unexport`, naming the
  # node, and nothing is wiped meanwhile: root on da2 keeps a file of the
  # lease's XFS open. Once it lets go, `gpuq recover` finishes.
  rm -f /w/alice/nfs-go /w/alice/nfs-written /w/alice/nfs-read-again
  idh=$(as_alice gpuq submit --stor nfs -- /w/alice/nfs.sh) || fail nfs-hold "submit"
  i=0; until [ -e /w/alice/nfs-written ]; do
    i=$((i+1)); [ $i -lt 600 ] || fail nfs-hold "the job wrote nothing after 300 s"; nap 0.5
  done
  L=$(sed -n 's/.*"lease": *"\([^"]*\)".*/\1/p' $state_dir/active.json | head -n1)
  f2=$(find "$D/da2/jobs/$L/nfs" -mindepth 2 -maxdepth 2 -name alice-file | head -1)
  [ -n "$f2" ] || fail nfs-hold "no alice-file on da2"
  sleep 100000 <"$f2" &
  holder=$!
  D2=$(dev_of SN-SITE-0002 1)
  touch /w/alice/nfs-go
  wait_state "$idh" completed 120
  i=0; until [ -e $state_dir/blocked.json ]; do
    i=$((i+1)); [ $i -lt 600 ] || { kill $holder; fail nfs-hold "not held after 300 s"; }; nap 0.5
  done
  mark nfs-job-end-to-held
  b=$(cat $state_dir/blocked.json)
  printf '%s' "$b" | grep -q '"step": *"unexport"' || { kill $holder; fail nfs-hold "not held at unexport: $b"; }
  printf '%s' "$b" | grep -q '"node": *"da2"' || { kill $holder; fail nfs-hold "the hold does not name da2: $b"; }
  w2=$(writes_of "$D2")
  blkid -p -o value -s TYPE "$D2" | grep -qx xfs || { kill $holder; fail nfs-hold "da2's XFS was wiped while mounted"; }
  kill $holder; wait $holder 2>/dev/null || true
  last=$(date +%s.%N)
  out=$(gq recover 2>&1) || fail nfs-hold "recover: $out"
  mark nfs-recover
  wait_released nfs-hold 300
  [ -z "$(nfs_left)" ] || fail nfs-hold "left: $(nfs_left)"
  zero_range "$D2" 0 $((1 << 20)) || fail nfs-hold "da2 not zero after recover"
  ok stor-nfsrdma-a-busy-node-mount-holds-at-unexport-wipes-nothing-and-recover-finishes

  # The crash-point loop at the points where an nfsrdma lease differs from
  # an nvmeof one (before_wipe and before_release are the same broker code,
  # crashed in scenario 4's loop).
  crash_chain nfs nfs_left before_unexport before_unmount exported mounted
  ok stor-nfsrdma-a-broker-killed-at-every-new-point-leaves-the-lease-clean-or-held-never-dirty
}
if [ "${SITE_SCENARIOS:-all}" = stor-nfs ]; then
  stor_nfs
  finish
fi

# --- stor-nfs-bench (integration/bench/stor-nfs.sh): one --stor nfsrdma
# job's stand-up and cleanup, gpuq against the same steps by hand as the
# original did them: from cxl2, one ssh per node, one after another:
# mkfs.xfs on each namespace (the same binary as gpuq's image, run
# directly with its own libraries), mount, chown, the nfsd filesystem
# (versions, grace, `tcp 2049`, threads) and the export caches primed by
# writing their channels (what exportfs + rpc.mountd put there, without
# either: neither is in the site VM's image); then on cxl2 `mount -t
# nfs4` of each (util-linux mount, no mount.nfs: the kernel parses the
# options). Cleanup: umount on cxl2; per node threads 0, caches flushed,
# umount, `blkdiscard -f`. No checks, no records, no audit. Prints
# "NFS-BENCH gpuq|hand RUN standup S cleanup S".
if [ "${SITE_SCENARIOS:-all}" = stor-nfs-bench ]; then
  modprobe nfsd || fail bench "modprobe nfsd"
  nsh() { nsenter --net=$NS_CXL2 ssh -F "$D/ssh/ssh_config" -i "$D/cxl2/ssh/id_harness" "$@"; }
  tnow() { date +%s.%N; }
  dt() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.2f", b-a}'; }
  # mkfs.xfs as the nodes would have it installed: the image's layer,
  # unpacked once (not timed).
  X=/opt/bench-xfs; rm -rf $X; mkdir -p $X/img $X/root
  tar -C $X/img -xf "$F/mkfs-image.tar"
  for l in $X/img/*.tar; do tar -C $X/root -xf "$l"; done
  MKFS="$X/root/lib64/ld-linux-x86-64.so.2 --library-path $X/root/lib/x86_64-linux-gnu $X/root/sbin/mkfs.xfs"
  $MKFS -V >/dev/null || fail bench "the unpacked mkfs.xfs does not run"
  # What is typed on each node (one ssh each): a script on the guest's
  # one filesystem, which every node's sshd sees.
  cat >/tmp/hb-up.sh <<'UP'
set -e
n=$1; shift; MKFS=$1; shift
R=/mnt/hb-$n; C=/run/hb-nfsd-$n; P=/proc/net/rpc
mkdir -p $R $C
exp=$(($(date +%s) + 3600))
for d in "$@"; do
  v=$(basename $d)
  $MKFS -q -K $d; mkdir -p $R/$v; mount $d $R/$v; chown 61001:61001 $R/$v; chmod 700 $R/$v
done
mount -t nfsd nfsd $C
echo -3 >$C/versions; echo 10 >$C/nfsv4gracetime; echo 'tcp 2049' >$C/portlist; echo 8 >$C/threads
# exportfs + rpc.mountd's answers, written before anyone asks: the
# client's domain; the pseudo-root (ro, crossmnt, fsid 0); each volume.
printf 'nfsd 10.200.0.10 %s hb\n' $exp >$P/auth.unix.ip/channel
printf 'hb 1 \\x00000000 %s %s\n' $exp $R >$P/nfsd.fh/channel
printf 'hb %s %s %s 65534 65534 0\n' $R $exp $((0x1 | 0x4 | 0x400 | 0x2000 | 0x4000)) >$P/nfsd.export/channel
j=0
for d in "$@"; do
  j=$((j+1)); v=$(basename $d)
  printf 'hb 1 \\x0%s000000 %s %s\n' $j $exp $R/$v >$P/nfsd.fh/channel
  printf 'hb %s %s %s 65534 65534 %s\n' $R/$v $exp $((0x4 | 0x400 | 0x2000)) $j >$P/nfsd.export/channel
done
UP
  cat >/tmp/hb-down.sh <<'DOWN'
set -e
n=$1; shift
R=/mnt/hb-$n; C=/run/hb-nfsd-$n
echo 0 >$C/threads
for c in auth.unix.ip nfsd.fh nfsd.export; do date +%s >/proc/net/rpc/$c/flush; done
for d in "$@"; do umount $R/$(basename $d); blkdiscard -f $d; done
umount $C
DOWN
  devs_of() { while read -r nn s p i; do [ "$nn" = "$1" ] && dev_of "$s" "$i"; done <<<"$ALLOW"; true; }
  for r in $(seq 1 "${STOR_BENCH_N:-5}"); do
    rm -f /w/alice/bench-ran
    t0=$(tnow)
    idb=$(as_alice gpuq submit --stor nfs -- touch /w/alice/bench-ran) || fail bench "submit"
    k=0; until [ -e /w/alice/bench-ran ]; do k=$((k+1)); [ $k -lt 6000 ] || fail bench "gpuq run $r: the job did not run: $(gq status "$idb" --json)"; nap 0.05; done
    t1=$(tnow)
    k=0; while [ -e $state_dir/active.json ]; do
      [ ! -e $state_dir/blocked.json ] || fail bench "held: $(cat $state_dir/blocked.json)"
      k=$((k+1)); [ $k -lt 6000 ] || fail bench "not released"; nap 0.05
    done
    t2=$(tnow)
    echo "NFS-BENCH gpuq $r standup $(dt "$t0" "$t1") cleanup $(dt "$t1" "$t2")"

    rm -f /w/alice/bench-ran
    t0=$(tnow)
    mounts=""
    for n in da1 da2 da3 da4; do
      # shellcheck disable=SC2046
      nsh "$n" "bash /tmp/hb-up.sh $n '$MKFS' $(devs_of $n | tr '\n' ' ')" || fail bench "by hand: export on $n"
      for d in $(devs_of $n); do mounts="$mounts $n:$(basename "$d")"; done
    done
    for m in $mounts; do
      n=${m%%:*}; v=${m##*:}
      mkdir -p /mnt/hbc/$n-$v
      nsenter --net=$NS_CXL2 mount -t nfs4 -o "vers=4.2,proto=tcp,addr=$(addr $n),clientaddr=10.200.0.10" "$(addr $n):/$v" /mnt/hbc/$n-$v \
        || fail bench "by hand: mount $m"
    done
    as_alice touch /w/alice/bench-ran
    for m in $mounts; do as_alice touch "/mnt/hbc/${m%%:*}-${m##*:}/x" || fail bench "by hand: alice cannot write $m"; done
    t1=$(tnow)
    for m in $mounts; do umount "/mnt/hbc/${m%%:*}-${m##*:}" || fail bench "by hand: umount $m"; done
    for n in da1 da2 da3 da4; do
      nsh "$n" "bash /tmp/hb-down.sh $n $(devs_of $n | tr '\n' ' ')" || fail bench "by hand: cleanup on $n"
    done
    t2=$(tnow)
    [ -z "$(findmnt -rn -t nfs4,xfs,nfsd)" ] || fail bench "by hand left: $(findmnt -rn -t nfs4,xfs,nfsd)"
    echo "NFS-BENCH hand $r standup $(dt "$t0" "$t1") cleanup $(dt "$t1" "$t2")"
  done
  finish
fi

# --- scenario 1: an ordinary user's --inst job writes data ---------------------
cat >/w/alice/job.sh <<'JOB'
set -eu
gpuq daos-exec -- sh -euc '
  dmg -o "$DAOS_CONTROL_CONFIG" -j system query > query.json
  dmg -o "$DAOS_CONTROL_CONFIG" -j pool create --size=5G --nranks=4 tank > pool.json
  daos -G "$DAOS_SYSTEM" -j container create --type=POSIX tank data > cont.json
  daos -G "$DAOS_SYSTEM" -j filesystem copy --src payload --dst daos://tank/data > copy.json
'
date +%s.%N > written
while [ ! -e go ]; do sleep 0.2; done
JOB
chown 61001:61001 /w/alice/job.sh
id=$(as_alice gpuq submit --inst inst1 --time 20m -- sh job.sh) || fail submit "gpuq submit --inst failed"
mark submit
wait_state "$id" running 600
mark prepare-to-running
i=0; until [ -e /w/alice/written ]; do
  i=$((i+1)); j=$(gq status "$id" --json)
  [ "$(field "$j" state)" = running ] || fail job "job $id is $(field "$j" state): $(cat "$(field "$j" log_path)" 2>/dev/null)"
  [ $i -lt 600 ] || fail job "no data written after 300 s: $(cat "$(field "$j" log_path)" 2>/dev/null)"
  nap 0.5
done
mark daos-exec-pool-container-copy
for f in query pool cont copy; do
  grep -q '"status": 0' "/w/alice/$f.json" || fail job "$f: $(cat "/w/alice/$f.json")"
done
[ "$(grep -c '"state": "joined"' /w/alice/query.json)" = 4 ] || fail job "not 4 joined: $(cat /w/alice/query.json)"
OFF=$(sed -n 's/^ *"offset": *\([0-9]*\).*/\1/p' /w/alice/copy.json)
[ -n "$OFF" ] || fail job "no offset in $(cat /w/alice/copy.json)"
LEASE=$(sed -n 's/.*"lease": *"\([^"]*\)".*/\1/p' /var/lib/gpuq-site/state/active.json | head -n1)
[ -n "$LEASE" ] || fail job "no active lease"
ok inst-job-created-pool-container-and-wrote-through-daos-exec

# While the job runs: the data is on every allowlisted namespace, at the
# simulator's offsets (docs/daos-sim.md), and the bystander is untouched.
LEN=${#PAYLOAD}
echo "$ALLOW" | while read -r n s p i; do
  d=$(dev_of "$s" "$i")
  [ "$(at "$d" 0 13)" = DAOS-SIM-BDEV ] || fail data "$n $d: no format header"
  [ "$(at "$d" $((1 << 20)) 13)" = DAOS-SIM-POOL ] || fail data "$n $d: no pool record at 1 MiB"
  [ "$(at "$d" $((2 << 20)) 13)" = DAOS-SIM-CONT ] || fail data "$n $d: no container record at 2 MiB"
  [ "$(at "$d" "$OFF" "$LEN")" = "$PAYLOAD" ] || fail data "$n $d: not the payload at $OFF"
  [ -d "$D/$n/jobs/$LEASE/control_meta" ] || fail data "$n: no metadata dir for $LEASE"
done
zero_range "$BYSTANDER" 0 $((8 << 20)) || fail data "$BYSTANDER (on no allowlist) was written"
ok data-on-every-allowlisted-namespace-during-the-job
# alice's own shell, outside her job (in no unit of it): refused in one
# line, and no client container is made for it.
out=$(as_alice gpuq daos-exec -- true 2>&1) && fail outside "daos-exec from outside the job ran: $out"
echo "$out" | grep -q 'works only inside a running --inst job' || fail outside "not the refusal: $out"
c=$(curl -sS --max-time 10 --unix-socket "$D/cxl2/run/podman.sock" 'http://d/v4.0.0/libpod/containers/json?all=true')
case "$c" in *-client-*) fail outside "a client container exists: $c" ;; esac
ok daos-exec-from-outside-the-job-is-refused
last=$(date +%s.%N)
JOBLOG=$(field "$(gq status "$id" --json)" log_path)
touch /w/alice/go
if [ "$ALL" = 1 ]; then
# The broker is killed (SIGKILL: no clean stop) during the cleanup's wipe.
# Under TCG a node's wipe takes 2-3 s, so each helper is frozen (SIGSTOP,
# by the PID the cluster recorded) the moment it holds one of its
# namespaces open — the wipe's exclusive handle — and the kill comes once
# all four are there (or, should one have been quicker, have its wipe in
# their audit). Then they are let go on without the broker. The polling
# uses shell builtins (one ls per round): a fork costs ~0.1 s here.
declare -A NODE_OF=()
for n in da1 da2 da3 da4; do NODE_OF[$(helper_pid $n)]=$n; done
i=0; while :; do
  mapfile -t lines <"$JOBLOG"
  [[ "${lines[*]}" == *"cleanup stop_servers: "* ]] && break
  i=$((i+1)); [ $i -lt 20000 ] || fail kill-during-wipe "the cleanup did not reach the wipe: $(tail -n 20 "$JOBLOG")"
  nap 0.02
done
FD_DIRS=$(printf '/proc/%s/fd ' "${!NODE_OF[@]}")
declare -A BEGUN=()
i=0; while [ ${#BEGUN[@]} -lt 4 ]; do
  cur=""
  while IFS= read -r line; do
    case "$line" in
      /proc/*/fd:) cur=${line#/proc/}; cur=${cur%/fd:} ;;
      *" -> /dev/nvme"*)
        n=${NODE_OF[$cur]}
        if [ -z "${BEGUN[$n]:-}" ]; then kill -STOP "$cur"; FROZEN="$FROZEN $cur"; BEGUN[$n]=wiping; fi ;;
    esac
  # shellcheck disable=SC2086
  done < <(ls -l $FD_DIRS 2>/dev/null)
  for n in da1 da2 da3 da4; do
    [ -n "${BEGUN[$n]:-}" ] && continue
    a=$D/$n/jobs/$LEASE/audit.jsonl
    [ -f "$a" ] || continue
    mapfile -t lines <"$a"
    [[ "${lines[*]}" == *'"step":"wipe"'* ]] && BEGUN[$n]=done
  done
  i=$((i+1)); [ $i -lt 3000 ] || fail kill-during-wipe "the wipe began on only ${!BEGUN[*]}: $(tail -n 20 "$JOBLOG")"
done
kill -9 "$(cat /var/lib/gpuq-site/broker.pid)"
thaw
mark job-end-to-wipe-kill-9
for n in da1 da2 da3 da4; do echo "SITE-INFO at the kill, $n: ${BEGUN[$n]}"; done
grep -q 'cleanup wipe' "$JOBLOG" && fail kill-during-wipe "the wipe had ended before the kill: $(tail -n 20 "$JOBLOG")"
# A new broker (as systemd's Restart= starts it) carries the cleanup on
# from its first unconfirmed step, the wipe: asked again, each node either
# finds nothing of the lease left (and says so in its audit) or wipes.
start_broker
mark broker-restart-links-up
wait_state "$id" completed 120
wait_released release 600
mark restart-to-released
sed -n "/resumes the cleanup of lease $LEASE/,\$p" "$JOBLOG" | grep -q '^.*cleanup wipe: ' \
  || fail kill-during-wipe "no wipe after the restart: $(tail -n 20 "$JOBLOG")"
ok kill-9-during-the-wipe-a-restarted-broker-repeats-the-wipe-and-releases
else
  wait_state "$id" completed 120
  wait_released release 600
  mark cleanup-to-released
fi

# After release: zeros where data was, no signature, audits, no metadata.
echo "$ALLOW" | while read -r n s p i; do
  d=$(dev_of "$s" "$i")
  for o in 0 $((1 << 20)) $((2 << 20)) "$OFF"; do
    zero_range "$d" "$o" 65536 || fail wipe "$n $d: not zero at $o after release"
  done
  zero_range "$d" 0 $((8 << 20)) || fail wipe "$n $d: first 8 MiB not zero"
  out=$(blkid -p "$d" 2>&1) && fail wipe "$n $d: blkid finds: $out"
  j=$D/$n/jobs/$LEASE
  # One record per namespace: the serial, and -nsN past the first.
  a=$j/wipe-$s.json; [ "$i" = 1 ] || a=$j/wipe-$s-ns$i.json
  [ -f "$a" ] || fail audit "$n: no $a: $(ls "$j")"
  grep -q "\"$s\"" "$a" || fail audit "$n: $a names no $s"
  grep -q "\"$p\"" "$a" || fail audit "$n: $a names no $p"
  grep -q "\"$d\"" "$a" || fail audit "$n: $a names no $d"
  grep -q '"result": "wiped"' "$a" || fail audit "$n: $a: $(cat "$a")"
  grep -q "\"bytes_discarded\": $NS_BYTES" "$a" || fail audit "$n: $a: not the whole namespace: $(cat "$a")"
  grep -q '"wipe"' "$j/audit.jsonl" || fail audit "$n: no wipe line in audit.jsonl"
  # Both attempts: the wipe before the kill, and the repeat after it.
  [ "$ALL" = 0 ] || [ "$(grep -c '"step":"wipe"' "$j/audit.jsonl")" -ge 2 ] \
    || fail audit "$n: not both wipe attempts in $(cat "$j/audit.jsonl")"
  [ ! -e "$j/control_meta" ] || fail metadata "$n: $j/control_meta still there"
  [ ! -e "$D/$n/jobs/active-lease" ] || fail release "$n: node lease record left"
done
zero_range "$BYSTANDER" 0 $((8 << 20)) || fail wipe "$BYSTANDER (on no allowlist) was touched"
ok wipe-left-zeros-no-signature-audits-and-no-metadata
for h in cxl2 da1 da2 da3 da4; do
  c=$(curl -sS --max-time 10 --unix-socket "$D/$h/run/podman.sock" 'http://d/v4.0.0/libpod/containers/json?all=true')
  [ "$c" = "[]" ] || fail release "containers left on $h: $c"
done
ok lease-released-no-containers-left

# The lifecycle's own step times, as the job's log reports them.
sed 's/^/SITE-LOG /' "$(field "$(gq status "$id" --json)" log_path)"

# The next job runs.
id2=$(as_alice gpuq submit -- sh -c 'echo next') || fail next "submit"
wait_state "$id2" completed 120
mark next-job
ok next-job-runs

if [ "$ALL" = 0 ]; then
  # Cancel and time limit of an --inst job under the systemd runner: each
  # ends the job's unit (its whole tree), then the lease is cleaned and
  # released as after any end.
  unit_active() { systemctl is-active -q "gpuq-job-$1.service"; }
  released() { # id what
    wait_released "$2" 300
    ! unit_active "$1" || fail "$2" "gpuq-job-$1.service still active"
  }
  idc=$(as_alice gpuq submit --inst inst1 -- sleep 600) || fail inst-cancel "submit"
  i=0; until unit_active "$idc"; do
    i=$((i+1)); [ $i -lt 600 ] || fail inst-cancel "no unit after 300 s: $(gq status "$idc" --json)"; nap 0.5
  done
  last=$(date +%s.%N)
  as_alice gpuq cancel "$idc" >/dev/null || fail inst-cancel "gpuq cancel $idc"
  wait_state "$idc" cancelled 120
  released "$idc" inst-cancel
  mark inst-cancel-to-released
  ok inst-cancel-ends-the-unit-and-releases
  last=$(date +%s.%N)
  idt=$(as_alice gpuq submit --inst inst1 --time 75s -- sleep 600) || fail inst-time-limit "submit"
  wait_state "$idt" timeout 300
  released "$idt" inst-time-limit
  mark inst-time-limit-to-released
  ok inst-time-limit-ends-the-unit-and-releases
  finish
fi

# What a refusal must leave alone: every node's jobs dir, lease record
# and containers, as listed now.
node_state() {
  for h in da1 da2 da3 da4; do echo "$h: $(ls "$D/$h/jobs")"; done
  for h in cxl2 da1 da2 da3 da4; do
    curl -sS --max-time 10 --unix-socket "$D/$h/run/podman.sock" 'http://d/v4.0.0/libpod/containers/json?all=true'; echo
  done
}
# Whether a device was written: the block layer's own counters of its
# completed writes and discards (/sys/block/DEV/stat fields 5, 7, 12, 14:
# write I/Os, sectors written, discard I/Os, sectors discarded), which
# count every write and BLKDISCARD from anyone, through the device node, a
# partition or a filesystem. A read of the whole namespace costs 15-40 s
# under TCG (docs/benchmarks.md); these cost nothing, and the page cache
# does not blur them. Where the content is compared too, MD5 (a change
# detector here, not a defence) is 2.6 times faster than SHA-256 in the guest.
sum_of() { md5sum <"$1" | cut -c1-32; }

# --- scenario 2: a partition table on da2's namespace --------------------------
# An MBR with one Linux partition (LBA 2048, 32 MiB), as fdisk writes it;
# the kernel scans it (nvme1n1p1 appears).
D2=$(dev_of SN-SITE-0002 1)
printf '\x00\x00\x00\x00\x83\x00\x00\x00\x00\x08\x00\x00\x00\x00\x01\x00' | dd of="$D2" bs=1 seek=446 conv=notrunc status=none
printf '\x55\xaa' | dd of="$D2" bs=1 seek=510 conv=notrunc,fsync status=none
blockdev --rereadpt "$D2" || fail partition "blockdev --rereadpt $D2"
[ -e "${D2}p1" ] || fail partition "the kernel shows no ${D2}p1"
sum2=$(sum_of "$D2"); w2=$(writes_of "$D2"); before=$(node_state)
last=$(date +%s.%N)
id3=$(as_alice gpuq submit --inst inst1 -- sh -c 'touch ran') || fail partition "submit"
wait_state "$id3" failed 300
mark preflight-refusal
log3=$(cat "$(field "$(gq status "$id3" --json)" log_path)")
echo "$log3" | grep -q 'preflight' || fail partition "no preflight refusal in: $log3"
echo "$log3" | grep -q 'da2' || fail partition "da2 not named: $log3"
echo "$log3" | grep -qi 'partition' || fail partition "no partition reason: $log3"
for h in da1 da3 da4; do echo "$log3" | grep -q "$h: .*refus" && fail partition "$h refused too: $log3"; done
[ ! -e /w/alice/ran ] || fail partition "the job ran"
[ "$(node_state)" = "$before" ] || fail partition "a node changed: before: $before; after: $(node_state)"
[ "$(writes_of "$D2")" = "$w2" ] || fail partition "$D2 was written: $w2, now $(writes_of "$D2")"
[ "$(sum_of "$D2")" = "$sum2" ] || fail partition "$D2 changed"
[ -e "${D2}p1" ] || fail partition "${D2}p1 is gone"
[ ! -e $state_dir/blocked.json ] || fail partition "held: $(cat $state_dir/blocked.json)"
ok preflight-refuses-a-partitioned-namespace-on-da2-and-touches-nothing
# Put it back as it was (zero): the next scenarios need a clean da2.
dd if=/dev/zero of="$D2" bs=512 count=1 conv=notrunc,fsync status=none
blockdev --rereadpt "$D2" || true
[ ! -e "${D2}p1" ] || fail partition "${D2}p1 still there after the MBR was removed"

# --- scenario 2b: da4's namespace exported by the kernel NVMe target -----------
# Someone exports da4's first namespace over NVMe-oF (configfs; an enabled
# namespace holds the device, a port is not needed for that). nvmet opens
# it without O_EXCL and as no process: neither the exclusive open nor the
# descriptor scan sees it, only nvmet's configfs tree does.
D4=$(dev_of SN-SITE-0005 1)
modprobe nvmet || fail nvmet "modprobe nvmet"
mountpoint -q /sys/kernel/config || mount -t configfs configfs /sys/kernel/config || fail nvmet "mount configfs"
S=/sys/kernel/config/nvmet/subsystems/nqn.2026-12.org.example:someone-else
unexport() { [ -d "$S" ] || return 0; echo 0 >"$S/namespaces/1/enable"; rmdir "$S/namespaces/1" "$S"; }
{ mkdir "$S" && mkdir "$S/namespaces/1" && echo "$D4" >"$S/namespaces/1/device_path" \
  && echo 1 >"$S/namespaces/1/enable"; } || { unexport; fail nvmet "export $D4"; }
w4=$(writes_of "$D4"); before=$(node_state)
last=$(date +%s.%N)
id6=$(as_alice gpuq submit --inst inst1 -- sh -c 'touch ran') || { unexport; fail nvmet "submit"; }
wait_state "$id6" failed 300
mark preflight-refusal-nvmet
log6=$(cat "$(field "$(gq status "$id6" --json)" log_path)")
# The same foreign subsystem refuses a --stor nvmeof job's preflight on
# every node (one kernel here: all four see it), before anything is made.
before6=$(node_state); cfs_before=$(find /sys/kernel/config/nvmet -mindepth 2 -maxdepth 2 | sort)
id7=$(as_alice gpuq submit --stor nvmeof -- sh -c 'touch ran') || { unexport; fail stor-foreign "submit"; }
wait_state "$id7" failed 300
log7=$(cat "$(field "$(gq status "$id7" --json)" log_path)")
cfs_after=$(find /sys/kernel/config/nvmet -mindepth 2 -maxdepth 2 | sort)
unexport
echo "$log7" | grep -q 'preflight refused' || fail stor-foreign "no preflight refusal: $log7"
for h in da1 da2 da3 da4; do
  echo "$log7" | grep -q "$h: foreign_subsystem: .*nqn.2026-12.org.example:someone-else" || fail stor-foreign "$h did not name the foreign subsystem: $log7"
done
[ "$cfs_after" = "$cfs_before" ] || fail stor-foreign "nvmet's tree changed: $cfs_before -> $cfs_after"
[ ! -e /w/alice/ran ] || fail stor-foreign "the job ran"
[ "$(node_state)" = "$before6" ] || fail stor-foreign "a node changed: before: $before6; after: $(node_state)"
[ ! -e $state_dir/blocked.json ] || fail stor-foreign "held: $(cat $state_dir/blocked.json)"
wait_released stor-foreign 300
ok stor-nvmeof-preflight-refuses-a-foreign-nvmet-subsystem-and-touches-nothing
echo "$log6" | grep -q 'da4' || fail nvmet "da4 not named: $log6"
echo "$log6" | grep -q 'exported over NVMe-oF by nvmet: subsystem nqn.2026-12.org.example:someone-else namespace 1' \
  || fail nvmet "no nvmet_export reason: $log6"
for h in da1 da2 da3; do echo "$log6" | grep -q "$h: .*refus" && fail nvmet "$h refused too: $log6"; done
[ ! -e /w/alice/ran ] || fail nvmet "the job ran"
[ "$(node_state)" = "$before" ] || fail nvmet "a node changed: before: $before; after: $(node_state)"
[ "$(writes_of "$D4")" = "$w4" ] || fail nvmet "$D4 was written: $w4, now $(writes_of "$D4")"
[ ! -e $state_dir/blocked.json ] || fail nvmet "held: $(cat $state_dir/blocked.json)"
ok preflight-refuses-a-namespace-exported-by-nvmet-on-da4-and-touches-nothing

# --- scenario 4: --stor nvmeof (#18) --------------------------------------------
# The operator loads the target's TCP transport and the host's (as
# modules-load.d would at boot); nvmet is loaded from scenario 2b.
modprobe -a nvmet-tcp nvme-tcp || fail stor "modprobe nvmet-tcp nvme-tcp"
# Without the operator's firewall rule an unprivileged user of cxl2 could
# reach the nodes' NVMe/TCP listeners (no authentication in this kernel):
# the job is refused after the export, in one line naming the rule, and
# nothing of it is left.
last=$(date +%s.%N)
idr=$(as_alice gpuq submit --stor nvmeof -- touch /w/alice/ran) || fail stor-reach "submit"
wait_state "$idr" failed 300
wait_released stor-reach 300
mark stor-unreachable-refusal
jr=$(gq status "$idr" --json)
printf '%s' "$jr" | grep -q 'an unprivileged user of this host can connect to its NVMe/TCP listener' \
  || fail stor-reach "no reachability refusal: $jr"
[ ! -e /w/alice/ran ] || fail stor-reach "the job ran"
[ -z "$(find /sys/kernel/config/nvmet -mindepth 2 -maxdepth 2)" ] || fail stor-reach "nvmet objects left"
for c in /sys/class/nvme/nvme*; do
  if grep -q '^nqn.2026-12.io.gpuq:' "$c/subsysnqn"; then fail stor-reach "controller $c connected"; fi
done
ok stor-nvmeof-refused-while-unprivileged-users-could-reach-the-listeners
# The operator's rule on the GPU host (cxl2): non-root sockets to 4420 are
# reset. The kernel initiator's sockets have no file, so no owner: allowed.
nsenter --net=$NS_CXL2 iptables -A OUTPUT -p tcp --dport 4420 -m owner --uid-owner 1-4294967294 \
  -j REJECT --reject-with tcp-reset || fail stor "iptables"
# alice's job writes its own mark at the start of every device it was
# given, records what it got, and waits; meanwhile another user must not
# open them and the nodes' namespaces must show alice's writes.
cat >/w/alice/stor.sh <<'JOB'
#!/bin/sh
set -e
echo "$GPUQ_STOR_DEVICES" >/w/alice/stor-devices
env | grep '^GPUQ_STOR_DEVICES_' | sort >/w/alice/stor-per-node
for d in $GPUQ_STOR_DEVICES; do
  printf 'alice-was-here %s\n' "$d" | dd of="$d" bs=4096 conv=sync,fsync status=none
done
touch /w/alice/stor-written
i=0; while [ ! -e /w/alice/stor-go ] && [ $i -lt 600 ]; do sleep 0.2; i=$((i+1)); done
# Again, after the nodes were put back as udev does on a change event.
for d in $GPUQ_STOR_DEVICES; do
  printf 'alice-again %s\n' "$d" | dd of="$d" bs=4096 seek=1 conv=sync,fsync status=none
done
touch /w/alice/stor-written-again
JOB
chown 61001:61001 /w/alice/stor.sh; chmod 755 /w/alice/stor.sh
rm -f /w/alice/stor-*
last=$(date +%s.%N)
id8=$(as_alice gpuq submit --stor nvmeof -- /w/alice/stor.sh) || fail stor "submit"
i=0; until [ -e /w/alice/stor-written ]; do
  i=$((i+1)); [ $i -lt 600 ] || fail stor "the job wrote nothing after 300 s: $(gq status "$id8" --json); $(cat "$(field "$(gq status "$id8" --json)" log_path)")"
  nap 0.5
done
mark stor-submit-to-written
devs=$(cat /w/alice/stor-devices)
[ "$(echo $devs | wc -w)" = 5 ] || fail stor "not five devices (da4 has two): $devs"
[ "$(wc -l </w/alice/stor-per-node)" = 4 ] || fail stor "not one variable per node: $(cat /w/alice/stor-per-node)"
grep -q '^GPUQ_STOR_DEVICES_DA4=/dev/nvme[0-9]*n[0-9]* /dev/nvme[0-9]*n[0-9]*$' /w/alice/stor-per-node || fail stor "da4 not two devices: $(cat /w/alice/stor-per-node)"
for d in $devs; do
  # What udev does to a block node on every change event (a writer's
  # close is one): alice's access is an ACL entry, which this keeps.
  chown root:disk "$d" && chmod 660 "$d" || fail stor "chown/chmod $d"
  setpriv --reuid=61002 --regid=61002 --clear-groups dd if="$d" of=/dev/null bs=4096 count=1 status=none 2>/dev/null \
    && fail stor "another user read $d"
done
# Each node's own namespace holds what alice wrote through the fabric.
echo "$ALLOW" | while read -r n s p i; do
  d=$(dev_of "$s" "$i")
  head -c 15 "$d" | grep -q '^alice-was-here' || fail stor "$n $d does not hold alice's mark: $(head -c 40 "$d" | od -c | head -2)"
done
rm -f /w/alice/stor-written-again
# The listener is in each node's own network namespace, on its address.
for n in da1 da2 da3 da4; do
  nsenter --net=/run/netns/$P-$n ss -ltnH | grep -q "$(addr $n):4420" || fail stor "$n: no listener on $(addr $n):4420"
done
ss -ltnH | grep -q ':4420' && fail stor "a listener in the guest's own namespace"
# Another user on cxl2 cannot reach a listener (the rule above).
nsenter --net=$NS_CXL2 setpriv --reuid=61002 --regid=61002 --clear-groups \
  timeout 5 bash -c "exec 3<>/dev/tcp/$(addr da1)/4420" 2>/dev/null && fail stor "uid 61002 on cxl2 reached da1:4420"
ok stor-nvmeof-job-writes-its-four-nodes-devices-as-the-user-and-another-user-cannot-open-them
# The export asked again for another host (token): refused (409), and
# nothing of the node's record, lease directory or nvmet changed.
L8=$(sed -n 's/.*"lease": *"\([^"]*\)".*/\1/p' $state_dir/active.json | head -n1)
st0=$(node_lease_state da3 "$L8"; find /sys/kernel/config/nvmet -maxdepth 3 | sort)
code=$(ask_node da3 "/v1/leases/$L8/export" '{"profile":"nvmeof","host_token":"0123456789abcdef0123456789abcdef"}') || true
[ "$code" = 409 ] || fail stor-again "another host: $code $(cat /tmp/ask.out)"
grep -q "already exported on this node" /tmp/ask.out || fail stor-again "not the refusal: $(cat /tmp/ask.out)"
[ "$(node_lease_state da3 "$L8"; find /sys/kernel/config/nvmet -maxdepth 3 | sort)" = "$st0" ] || fail stor-again "da3 or nvmet changed"
ok stor-nvmeof-an-export-asked-again-for-another-host-is-refused-changing-nothing
touch /w/alice/stor-go
wait_state "$id8" completed 120
[ -e /w/alice/stor-written-again ] || fail stor "the job's second writes did not happen"
last=$(date +%s.%N)
wait_released stor 300
mark stor-job-end-to-released
log8=$(cat "$(field "$(gq status "$id8" --json)" log_path)")
for st in disconnect unexport wipe; do echo "$log8" | grep -q "cleanup $st: " || fail stor "no cleanup $st in: $log8"; done
# (A for loop, not a pipeline: `fail` must end this script.)
for c in /sys/class/nvme/nvme*; do
  if grep -q '^nqn.2026-12.io.gpuq:' "$c/subsysnqn"; then fail stor "controller $c of the lease left"; fi
done
[ -z "$(find /sys/kernel/config/nvmet -mindepth 2 -maxdepth 2)" ] \
  || fail stor "nvmet objects left: $(find /sys/kernel/config/nvmet -mindepth 2 -maxdepth 2)"
for d in $devs; do [ ! -e "$d" ] || fail stor "$d still exists"; done
echo "$ALLOW" | while read -r n s p i; do
  d=$(dev_of "$s" "$i")
  zero_range "$d" 0 $((1 << 20)) || fail stor "$n $d is not zero after the wipe"
  L=$(ls -t "$D/$n/jobs" | grep -v '^claim.json$' | head -1)
  for st in export unexport wipe; do
    grep "\"step\":\"$st\"" "$D/$n/jobs/$L/audit.jsonl" | grep -q '"result":"ok"' \
      || fail stor "$n: no $st ok in $D/$n/jobs/$L/audit.jsonl: $(cat "$D/$n/jobs/$L/audit.jsonl")"
  done
done
ok stor-nvmeof-cleanup-disconnects-unexports-wipes-and-leaves-nothing
sed 's/^/SITE-LOG /' <<<"$log8"

# Cancelled during its stand-up: cleaned and released, nothing left.
last=$(date +%s.%N)
id9=$(as_alice gpuq submit --stor nvmeof -- sleep 600) || fail stor-cancel "submit"
i=0; until grep -q 'exported on 4 nodes' "$(field "$(gq status "$id9" --json)" log_path)" 2>/dev/null; do
  i=$((i+1)); [ $i -lt 600 ] || fail stor-cancel "not exported after 300 s: $(gq status "$id9" --json)"; nap 0.5
done
as_alice gpuq cancel "$id9" >/dev/null || fail stor-cancel "gpuq cancel"
wait_state "$id9" cancelled 120
wait_released stor-cancel 300
mark stor-cancel-to-released
[ -z "$(find /sys/kernel/config/nvmet -mindepth 2 -maxdepth 2)" ] \
  || fail stor-cancel "nvmet objects left: $(find /sys/kernel/config/nvmet -mindepth 2 -maxdepth 2)"
for c in /sys/class/nvme/nvme*; do
  if grep -q '^nqn.2026-12.io.gpuq:' "$c/subsysnqn"; then fail stor-cancel "controller $c left"; fi
done
ok stor-nvmeof-cancel-during-stand-up-cleans-and-releases

# What a --stor lease leaves behind on this host and the nodes: nothing.
stor_left() {
  for c in /sys/class/nvme/nvme*; do
    if grep -q '^nqn.2026-12.io.gpuq:' "$c/subsysnqn"; then echo "controller $c"; fi
  done
  find /sys/kernel/config/nvmet -mindepth 2 -maxdepth 2
  for h in da1 da2 da3 da4; do [ ! -e "$D/$h/jobs/lease.json" ] || echo "$h: lease.json"; done
}
# kill -9 of the broker while it prepares a --stor lease (the exports
# made, the connect under way or done): a restarted broker holds the lease
# (it was preparing) or, if it had just marked it running, re-adopts the
# job. Held: `gpuq recover` disconnects, unexports and wipes. Never dirty.
last=$(date +%s.%N)
id10=$(as_alice gpuq submit --stor nvmeof -- sh -c 'sleep 5') || fail stor-kill "submit"
L10=$(field "$(gq status "$id10" --json)" log_path)
i=0; until grep -q 'exported on 4 nodes' "$L10" 2>/dev/null; do
  i=$((i+1)); [ $i -lt 3000 ] || fail stor-kill "not exported after 300 s: $(gq status "$id10" --json)"; nap 0.1
done
kill -9 "$(cat /var/lib/gpuq-site/broker.pid)"
start_broker
if [ -e $state_dir/blocked.json ]; then
  echo "SITE-INFO stor-kill: held (the broker died while preparing): $(cat $state_dir/blocked.json)"
  wait_state "$id10" lost 300
  out=$(gq recover 2>&1) || fail stor-kill "recover: $out"
else
  echo "SITE-INFO stor-kill: not held (the lease was running): the job is re-adopted"
  wait_state "$id10" completed 120
fi
wait_released stor-kill 300
mark stor-kill-9-preparing-to-released
[ -z "$(stor_left)" ] || fail stor-kill "left: $(stor_left)"
echo "$ALLOW" | while read -r n s p i; do zero_range "$(dev_of "$s" "$i")" 0 $((1 << 20)) || fail stor-kill "$n not zero"; done
ok stor-nvmeof-kill-9-while-preparing-ends-held-or-clean-and-recover-leaves-nothing

# kill -9 while the --stor job runs: the restarted broker re-adopts the
# job (its devices stay connected), waits for its end, then cleans up.
rm -f /w/alice/stor-go /w/alice/stor-written
last=$(date +%s.%N)
readopt nvmeof /w/alice/stor.sh /w/alice/stor-written stor-readopt
id11=$RO_ID
touch /w/alice/stor-go
wait_state "$id11" completed 120
[ -e /w/alice/stor-written-again ] || fail stor-readopt "the job could not write after the restart"
wait_released stor-readopt 300
mark stor-kill-9-running-to-released
[ -z "$(stor_left)" ] || fail stor-readopt "left: $(stor_left)"
ok stor-nvmeof-kill-9-while-the-job-runs-is-re-adopted-and-cleaned

# An unexport that cannot finish holds the lease at `unexport`, naming the
# node, and nothing is wiped meanwhile: someone links a subsystem of their
# own into da2's port while the job runs (so the port is not the lease's
# alone and the lease's subsystem cannot be removed while the port links
# it). Once that is undone, `gpuq recover` finishes: unexport, wipe.
rm -f /w/alice/stor-go /w/alice/stor-written /w/alice/stor-written-again
last=$(date +%s.%N)
id12=$(as_alice gpuq submit --stor nvmeof -- /w/alice/stor.sh) || fail stor-hold "submit"
i=0; until [ -e /w/alice/stor-written ]; do
  i=$((i+1)); [ $i -lt 600 ] || fail stor-hold "the job wrote nothing after 300 s"; nap 0.5
done
port2=$(sed -n 's/^ *"port_id": *\([0-9]*\),*$/\1/p' "$D/da2/jobs/lease.json")
[ -n "$port2" ] || fail stor-hold "no port_id in da2's record: $(cat "$D/da2/jobs/lease.json")"
C=/sys/kernel/config/nvmet
I=$C/subsystems/nqn.2026-12.org.example:intruder
mkdir "$I" && ln -s "$I" "$C/ports/$port2/subsystems/nqn.2026-12.org.example:intruder" || fail stor-hold "the intruder's link"
D2=$(dev_of SN-SITE-0002 1); w2=$(writes_of "$D2")
touch /w/alice/stor-go
wait_state "$id12" completed 120
i=0; until [ -e $state_dir/blocked.json ]; do
  i=$((i+1)); [ $i -lt 600 ] || fail stor-hold "not held after 300 s"; nap 0.5
done
mark stor-job-end-to-held
b=$(cat $state_dir/blocked.json)
printf '%s' "$b" | grep -q '"step": *"unexport"' || fail stor-hold "not held at unexport: $b"
printf '%s' "$b" | grep -q '"node": *"da2"' || fail stor-hold "the hold does not name da2: $b"
w2=$(writes_of "$D2")
head -c 15 "$D2" | grep -q '^alice-was-here' || fail stor-hold "da2's namespace was wiped while exported"
out=$(gq recover 2>&1) && fail stor-hold "recover passed with the intruder still linked: $out"
[ "$(writes_of "$D2")" = "$w2" ] || fail stor-hold "da2's namespace was written by the refused recover"
rm "$C/ports/$port2/subsystems/nqn.2026-12.org.example:intruder" && rmdir "$I" || fail stor-hold "undo the intruder"
last=$(date +%s.%N)
out=$(gq recover 2>&1) || fail stor-hold "recover: $out"
mark stor-recover
wait_released stor-hold 300
[ -z "$(stor_left)" ] || fail stor-hold "left: $(stor_left)"
zero_range "$D2" 0 $((1 << 20)) || fail stor-hold "da2 not zero after recover"
ok stor-nvmeof-a-failed-unexport-holds-naming-the-node-wipes-nothing-and-recover-finishes

# The crash-point loop for --stor nvmeof, every point (crash_chain above).
crash_chain nvmeof stor_left before_release before_wipe before_unexport before_disconnect exported connected
ok stor-nvmeof-a-broker-killed-at-every-new-point-leaves-the-lease-clean-or-held-never-dirty
modprobe -r nvme-tcp nvmet-tcp nvmet || fail stor "modprobe -r"
stor_nfs

# --- scenario 3: a filesystem from da3's namespace mounted during the job ------
D3=$(dev_of SN-SITE-0003 1)
rm -f /w/alice/written /w/alice/go
id4=$(as_alice gpuq submit --inst inst1 -- sh job.sh) || fail mounted "submit"
i=0; until [ -e /w/alice/written ]; do
  i=$((i+1)); [ $i -lt 600 ] || fail mounted "no data written: $(gq status "$id4" --json)"; nap 0.5
done
L4=$(sed -n 's/.*"lease": *"\([^"]*\)".*/\1/p' $state_dir/active.json | head -n1)
[ -n "$L4" ] || fail mounted "no active lease"
# Someone (root) makes and mounts a filesystem on da3's namespace while
# the job runs. Read-only: the mount holds the device, and nothing writes.
mkfs.ext4 -q -F "$D3" || fail mounted "mkfs.ext4 $D3"
mkdir -p /mnt/da3 && mount -o ro "$D3" /mnt/da3 || fail mounted "mount $D3"
sync; w3=$(writes_of "$D3")
last=$(date +%s.%N)
touch /w/alice/go
wait_state "$id4" completed 120
i=0; until [ -e $state_dir/blocked.json ]; do
  i=$((i+1)); [ $i -lt 600 ] || fail mounted "no hold after 300 s: $(gq daos-status 2>&1)"; nap 0.5
done
mark cleanup-to-held
grep -q da3 $state_dir/blocked.json || fail mounted "the hold names no da3: $(cat $state_dir/blocked.json)"
[ "$(writes_of "$D3")" = "$w3" ] || fail mounted "$D3 was written while mounted: $w3, now $(writes_of "$D3")"
findmnt -rn -S "$D3" >/dev/null || fail mounted "$D3 no longer mounted"
# The hold holds every job, a GPU-only one too.
id5=$(as_alice gpuq submit -- sh -c 'echo after-hold') || fail mounted "submit after hold"
sleep 5
[ "$(field "$(gq status "$id5" --json)" state)" = queued ] || fail mounted "job $id5 ran under the hold"
ok a-mounted-namespace-holds-the-cleanup-at-the-wipe-untouched
# Unmounted, its ext4 signature is still a foreign signature: recover
# refuses again and touches nothing.
umount /mnt/da3
[ "$(writes_of "$D3")" = "$w3" ] || fail mounted "$D3 was written by its unmount: $w3, now $(writes_of "$D3")"
out=$(gq recover 2>&1) && fail mounted "recover passed with ext4 on $D3: $out"
echo "$out" | grep -q da3 || fail mounted "recover's refusal names no da3: $out"
[ "$(writes_of "$D3")" = "$w3" ] || fail mounted "$D3 was written by the refused recover: $w3, now $(writes_of "$D3")"
blkid -p -o value -s TYPE "$D3" | grep -qx ext4 || fail mounted "$D3 is no longer ext4"
[ -e $state_dir/blocked.json ] || fail mounted "released with ext4 on $D3"
ok recover-refuses-while-a-foreign-filesystem-is-there
# The operator decides the filesystem is not needed and removes its
# signature; then recover completes the lease's cleanup and releases.
wipefs -q -a "$D3" || fail mounted "wipefs $D3"
last=$(date +%s.%N)
out=$(gq recover 2>&1) || fail mounted "recover after wipefs: $out"
mark recover
[ ! -e $state_dir/blocked.json ] || fail mounted "still held after recover"
grep -Eq '"(refused|failed)"' "$D/da3/jobs/$L4/audit.jsonl" || fail mounted "da3's audit has no refused wipe: $(cat "$D/da3/jobs/$L4/audit.jsonl")"
zero_range "$D3" 0 $((8 << 20)) || fail mounted "$D3 not zero after recover"
out=$(blkid -p "$D3" 2>&1) && fail mounted "$D3: blkid finds: $out"
wait_state "$id5" completed 120
ok after-umount-and-wipefs-recover-completes-and-the-held-job-runs

finish
