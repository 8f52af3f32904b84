#!/bin/sh
# Runs as root inside the site VM: the DAOS simulator in physical mode.
# `bdev_list` names NVMe controllers by PCI address (class nvme, as DAOS's
# daos_server.yml does); `dmg storage format` must write the simulator's
# header to every namespace of exactly those controllers (the wipe then has
# a real signature to remove) and touch no other device. A PCI address
# without NVMe fails the format and writes nothing.
# "SITE-CHECK <name> ok" / "SITE-FAIL <name>: why".
set -eu
F=${F:-/gpuq}
fail() { echo "SITE-FAIL $1: $2"; [ -f /var/tmp/sim/server.log ] && sed 's/^/server: /' /var/tmp/sim/server.log | tail -20; exit 1; }
ok() { echo "SITE-CHECK $1 ok"; }
W=/var/tmp/sim
rm -rf "$W"; mkdir -p "$W/bin"
for t in daos_server dmg; do ln -s "$F/daos-sim" "$W/bin/$t"; done
ctrl_of() { for c in /sys/class/nvme/nvme*; do if [ "$(cat "$c/address")" = "$1" ]; then basename "$c"; fi; done; }
zeros() { cmp -s -n 1048576 "$1" /dev/zero; }
head_is_ours() { [ "$(head -c 14 "$1")" = "DAOS-SIM-BDEV" ]; }   # 13 bytes + newline
A=0000:00:11.0; B=0000:00:15.0
a=$(ctrl_of $A); b=$(ctrl_of $B)
[ -n "$a" ] && [ -n "$b" ] || fail setup "no controllers at $A / $B"
for d in /dev/nvme*n*; do zeros "$d" || fail setup "$d is not zero before the format"; done

start() { # pci list (YAML flow items)
  rm -rf "$W/md"; mkdir -p "$W/md"
  cat >"$W/server.yml" <<YML
name: daos_server
port: 10001
mgmt_svc_replicas: ['127.0.0.1:10001']
provider: ofi+tcp
transport_config: {allow_insecure: true}
control_metadata: {path: $W/md}
control_log_file: $W/control.log
disable_vfio: true
system_ram_reserved: 2
fault_path: /da1
engines:
  - targets: 1
    fabric_iface: lo
    fabric_iface_port: 31416
    storage:
      - {class: ram, scm_mount: /mnt/daos, scm_size: 4}
      - {class: nvme, bdev_list: [$1], bdev_roles: [wal, meta, data]}
YML
  printf 'name: daos_server\nport: 10001\nhostlist: [127.0.0.1]\ntransport_config: {allow_insecure: true}\n' >"$W/control.yml"
  "$W/bin/daos_server" start -o "$W/server.yml" >"$W/server.log" 2>&1 &
  SERVER=$!
  i=0; until "$W/bin/dmg" -o "$W/control.yml" -j system query >/dev/null 2>&1 || grep -q uninitialized "$W/server.log" 2>/dev/null; do
    i=$((i+1)); [ $i -lt 100 ] || fail start "the simulator did not answer"; sleep 0.2
    # an uninitialised system answers with an error envelope: that is up
    "$W/bin/dmg" -o "$W/control.yml" -j system query 2>/dev/null | grep -q uninitialized && break
  done
}
SERVER=
stop() { [ -z "$SERVER" ] || { kill "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true; SERVER=; }; }
trap stop EXIT

# A PCI address with no NVMe behind it: the format fails, nothing written.
start '"0000:00:1f.0"'
# As with DAOS, a host's failure is a `host_errors` entry of the reply
# (the broker's format step fails on it, naming the host).
out=$("$W/bin/dmg" -o "$W/control.yml" -j storage format 2>&1) || true
echo "$out" | grep -q '"host_errors": {}' && fail no-nvme "formatted: $out"
echo "$out" | grep -q "no NVMe namespace of controller 0000:00:1f.0" || fail no-nvme "$out"
stop
for d in /dev/nvme*n*; do zeros "$d" || fail no-nvme "$d was written"; done
ok a-pci-address-without-nvme-fails-the-format-and-writes-nothing

# A namespace in use (mounted): the format's O_EXCL open fails, as SPDK
# cannot claim it; the filesystem on it is left as it was.
C=0000:00:14.0; c=$(ctrl_of $C)
[ -n "$c" ] || fail setup "no controller at $C"
mkfs.ext4 -q -F "/dev/${c}n1" || fail in-use "mkfs.ext4 /dev/${c}n1"
# The header would go at offset 0; ext4 leaves the first KiB alone (its
# superblock, at 1 KiB, changes with the mount itself).
first_kib() { head -c 1024 "$1" | sha256sum | cut -d' ' -f1; }
before=$(first_kib "/dev/${c}n1")
mkdir -p /mnt/in-use && mount "/dev/${c}n1" /mnt/in-use || fail in-use "mount /dev/${c}n1"
start "\"$C\""
out=$("$W/bin/dmg" -o "$W/control.yml" -j storage format 2>&1) || true
stop
umount /mnt/in-use
echo "$out" | grep -q '"host_errors": {}' && fail in-use "formatted a mounted namespace: $out"
echo "$out" | grep -q "/dev/${c}n1" || fail in-use "$out"
head_is_ours "/dev/${c}n1" && fail in-use "the header was written to the mounted /dev/${c}n1"
[ "$(first_kib "/dev/${c}n1")" = "$before" ] || fail in-use "the first KiB of /dev/${c}n1 changed"
blkid -p -o value -s TYPE "/dev/${c}n1" | grep -qx ext4 || fail in-use "/dev/${c}n1 is no longer ext4"
ok a-mounted-namespace-fails-the-format-and-is-left-as-it-was

# Two controllers (one with two namespaces): exactly their namespaces get
# the header.
start "\"$A\", \"$B\""
out=$("$W/bin/dmg" -o "$W/control.yml" -j storage format 2>&1) || fail format "$out"
echo "$out" | grep -q '"host_errors": {}' || fail format "$out"
stop
for d in /dev/nvme*n*; do
  dc=$(basename "$d" | sed 's/n[0-9]*$//')
  if [ "$dc" = "$a" ] || [ "$dc" = "$b" ]; then
    head_is_ours "$d" || fail format "$d has no header: $(head -c 80 "$d" | od -c | head -3)"
  elif [ "$d" = "/dev/$(ctrl_of $C)n1" ]; then
    head_is_ours "$d" && fail format "$d (not listed, holds ext4) got the header"
  else
    zeros "$d" || fail format "$d (not listed) was written"
  fi
done
[ "$(ls /dev/${b}n*)" = "/dev/${b}n1
/dev/${b}n2" ] || fail format "controller $b should have two namespaces: $(ls /dev/${b}n*)"
ok format-writes-exactly-the-listed-controllers-namespaces
echo "SITE-DONE"
