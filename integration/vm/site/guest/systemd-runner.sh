#!/bin/sh
# Runs as root inside the site VM (systemd as PID 1), from the files disk
# mounted at $F: the shipped gpuq-broker.service with runner = "systemd",
# driven by the real gpuq CLI as an ordinary user. Prints one
# "SITE-CHECK <name> ok" line per check and "SITE-FAIL <name>: <why>" (then
# exits 1) on the first that fails. The caller (tests/tests/site_vm.rs)
# says which cgroup mode the guest booted in: SITE_CGROUP=v1|v2.
set -eu
F=${F:-/gpuq}
MODE=${SITE_CGROUP:?SITE_CGROUP=v1|v2}
fail() { echo "SITE-FAIL $1: $2"; journalctl -u gpuq-broker --no-pager -n 40 2>/dev/null | sed 's/^/broker: /'; exit 1; }
ok() { echo "SITE-CHECK $1 ok"; }
# A string or number field of `gpuq status --json` (pretty JSON, one
# "key": value per line; the guest has no jq).
field() { printf '%s\n' "$1" | sed -n "s/^ *\"$2\": *\"\{0,1\}\([^,\"]*\)\"\{0,1\},\{0,1\}$/\1/p" | head -n1; }
as_alice() { (cd /w/alice && setpriv --reuid=61001 --regid=61001 --init-groups env HOME=/w/alice "$@"); }
status() { gpuq status "$1" --json; }
wait_state() { # id state secs (each gpuq call takes about a second under TCG)
  end=$(( $(date +%s) + $3 ))
  while :; do
    j=$(status "$1"); s=$(field "$j" state)
    [ "$s" = "$2" ] && return 0
    [ "$(date +%s)" -lt "$end" ] || fail "wait-$2" "job $1 is '$s' after $3 s, not $2: $j"
    sleep 0.2
  done
}

# The cgroup mode the kernel command line asked for.
if [ "$MODE" = v1 ]; then
  grep -q '^0::' /proc/self/cgroup && fail cgroup-mode "a 0:: line on a v1-only boot: $(cat /proc/self/cgroup)"
  grep -q ':name=systemd:' /proc/self/cgroup || fail cgroup-mode "no name=systemd line: $(cat /proc/self/cgroup)"
else
  [ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ] || fail cgroup-mode "/sys/fs/cgroup is not cgroup2"
fi
ok cgroup-mode-$MODE
[ "$(ps -p 1 -o comm=)" = systemd ] || fail pid1 "PID 1 is $(ps -p 1 -o comm=)"
ok pid1-systemd

install -m 755 "$F/gpuq-broker" /usr/local/sbin/gpuq-broker
install -m 755 "$F/gpuq" /usr/local/bin/gpuq
install -m 644 "$F/gpuq-broker.service" /etc/systemd/system/gpuq-broker.service
mkdir -p /etc/systemd/system/gpuq-broker.service.d /etc/gpuqueue-daos
printf '[Service]\nRestart=no\nEnvironment=GPUQ_LOG=debug\n' >/etc/systemd/system/gpuq-broker.service.d/test.conf
cat >/etc/gpuqueue-daos/broker.toml <<'TOML'
[broker]
socket = "/run/gpuq/broker.sock"
state_dir = "/var/lib/gpuqueue-daos"
log_root = "/var/log/gpuq"
maintenance_file = "/etc/gpuqueue-daos/maintenance.json"
runner = "systemd"
gpu = "none"
default_time = "10m"
max_time = "1h"
TOML
systemctl daemon-reload
systemctl start gpuq-broker.service || fail broker-start "$(systemctl status --no-pager gpuq-broker 2>&1 | tail -20)"
ok broker-start

getent group 61001 >/dev/null || groupadd -g 61001 alice
id alice >/dev/null 2>&1 || useradd -u 61001 -g 61001 -M -d /w/alice -s /bin/sh alice
mkdir -p /w/alice && chown 61001:61001 /w/alice && chmod 700 /w/alice

# A job runs as the user in its own unit. Its /proc/self/cgroup is what
# daos-exec's caller check (job_of_pid) reads: on v1 only systemd's
# name=systemd line names the unit (the parser's unit tests use this form).
id=$(as_alice gpuq submit -- sh -c 'echo hello; id -u; cat /proc/self/cgroup') \
  || fail submit "gpuq submit failed"
wait_state "$id" completed 60
log=$(cat "$(field "$(status "$id")" log_path)")
echo "$log" | grep -qx hello || fail job-log "no 'hello' in: $log"
echo "$log" | grep -qx 61001 || fail job-user "not uid 61001: $log"
case "$MODE" in
  v1) echo "$log" | grep -q "^1:name=systemd:/system.slice/gpuq-job-$id.service$" || fail job-cgroup "v1: $log"
      echo "$log" | grep -q '^0::' && fail job-cgroup "v1 with a 0:: line: $log" ;;
  v2) echo "$log" | grep -q "^0::/system.slice/gpuq-job-$id.service$" || fail job-cgroup "v2: $log" ;;
esac
ok job-runs-as-the-user-in-its-unit

# Cancel ends the unit and every process of it.
id=$(as_alice gpuq submit -- sh -c 'sleep 1000 & setsid sleep 1001 & wait') || fail submit "cancel job"
wait_state "$id" running 60
i=0; until pgrep -u 61001 -f 'sleep 100[01]' >/dev/null; do i=$((i+1)); [ $i -lt 100 ] || fail cancel "the job's sleeps never ran"; sleep 0.1; done
as_alice gpuq cancel "$id" >/dev/null || fail cancel "gpuq cancel failed"
wait_state "$id" cancelled 30
i=0; while pgrep -u 61001 -f 'sleep 100[01]' >/dev/null; do i=$((i+1)); [ $i -lt 100 ] || fail cancel "processes left: $(pgrep -a -u 61001)"; sleep 0.1; done
ok cancel-ends-the-unit

# The time limit ends it as timeout.
id=$(as_alice gpuq submit --time 3s -- sleep 1000) || fail submit "time-limit job"
wait_state "$id" timeout 60
pgrep -u 61001 -f 'sleep 1000' >/dev/null && fail time-limit "sleep left: $(pgrep -a -u 61001)"
ok time-limit-ends-the-unit
systemctl is-active --quiet gpuq-broker.service || fail broker-alive "the broker died"
echo "SITE-DONE"
