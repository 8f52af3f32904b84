#!/bin/sh
# Runs as root inside the site VM: what physical mode needs of the guest is
# there — the emulated NVMe as `up` made it (serial, PCI address, nsid,
# size), huge pages, and a memlock limit root can raise to unlimited (this
# build host refuses that). "SITE-CHECK <name> ok" / "SITE-FAIL <name>: why".
set -eu
fail() { echo "SITE-FAIL $1: $2"; exit 1; }
ok() { echo "SITE-CHECK $1 ok"; }
for n in 1 2 3 4 5; do
  c=
  for d in /sys/class/nvme/nvme*; do
    [ "$(tr -d ' ' <"$d/serial")" = "SN-SITE-000$n" ] && c=$d
  done
  [ -n "$c" ] || fail nvme "no controller with serial SN-SITE-000$n: $(cat /sys/class/nvme/*/serial)"
  [ "$(cat "$c/address")" = "0000:00:1$n.0" ] || fail nvme "SN-SITE-000$n at $(cat "$c/address")"
  name=$(basename "$c")
  nsids=$(for ns in /sys/block/${name}n*; do cat "$ns/nsid" 2>/dev/null || cat "$ns/device/../$(basename "$ns")/nsid"; done | sort | tr '\n' ' ')
  want="1 "; [ "$n" = 5 ] && want="1 2 "
  [ "$nsids" = "$want" ] || fail nvme "SN-SITE-000$n has namespaces '$nsids', want '$want'"
  for ns in /sys/block/${name}n*; do
    [ "$(cat "$ns/size")" = 4194304 ] || fail nvme "$(basename "$ns") is $(cat "$ns/size") sectors, not 2 GiB"
  done
done
ok nvme-five-controllers-six-namespaces
[ "$(sed -n 's/^HugePages_Total: *//p' /proc/meminfo)" = 512 ] || fail hugepages "$(grep Huge /proc/meminfo)"
ok hugepages-512
[ "$(prlimit --memlock=unlimited:unlimited sh -c 'ulimit -Hl')" = unlimited ] || fail memlock "root cannot raise memlock"
ok memlock-unlimited
echo "SITE-DONE"
