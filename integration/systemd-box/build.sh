#!/usr/bin/env bash
# Build the root filesystem of the "systemd box": a minimal Debian 12
# (bookworm) tree with systemd as /sbin/init and D-Bus, in which the
# systemd-runner tests boot a real systemd as PID 1 of a Podman container.
#
# Usage: build.sh OUT_DIR      (as root; needs debootstrap and the Debian mirror)
# Result: OUT_DIR/rootfs/ and OUT_DIR/rootfs.stamp (written last). Does
# nothing when the stamp already names this version. Concurrent callers wait
# on OUT_DIR/.lock, so the tree is built once.
# Mirror: $GPUQ_DEBIAN_MIRROR, else the first Debian URI in /etc/apt/sources.list*,
# else http://deb.debian.org/debian.
set -euo pipefail

VERSION="systemd-box v1: bookworm minbase + systemd systemd-sysv dbus procps passwd"
OUT=${1:?usage: build.sh OUT_DIR}

if [ "$(id -u)" != 0 ]; then
  echo "build.sh: run as root (debootstrap creates device nodes and owners)" >&2
  exit 1
fi
command -v debootstrap >/dev/null || {
  echo "build.sh: debootstrap is not installed (apt-get install debootstrap)" >&2
  exit 1
}

mkdir -p "$OUT"
exec 9>"$OUT/.lock"
flock 9
if [ -f "$OUT/rootfs.stamp" ] && [ "$(cat "$OUT/rootfs.stamp")" = "$VERSION" ] && [ -x "$OUT/rootfs/sbin/init" ]; then
  exit 0
fi

mirror=$("$(dirname "$0")/../debian-mirror")

rm -f "$OUT/rootfs.stamp"
tmp="$OUT/rootfs.new"
rm -rf "$tmp" "$OUT/rootfs"
echo "build.sh: debootstrap bookworm from $mirror into $OUT/rootfs (about 1-2 minutes)" >&2
if ! debootstrap --variant=minbase --include=systemd,systemd-sysv,dbus,procps,passwd \
  bookworm "$tmp" "$mirror" >"$OUT/debootstrap.log" 2>&1; then
  tail -n 30 "$OUT/debootstrap.log" >&2
  echo "build.sh: debootstrap failed (full log: $OUT/debootstrap.log)" >&2
  exit 1
fi

# debootstrap can leave the target's /proc (or /sys) mounted; a mount moved
# with the tree below would outlive the build (and a copy of target/ would
# read /proc/kcore). Unmount whatever is mounted below it, deepest first.
findmnt -rn -o TARGET | { grep -F "$tmp/" || true; } | sort -r | while read -r m; do
  umount "$m"
done

# A container needs no getty, no udev-driven units and no time sync; keep
# the boot short and quiet. The machine ID is created at each boot.
for u in getty@tty1.service console-getty.service systemd-timesyncd.service \
  systemd-networkd.service systemd-resolved.service apt-daily.timer apt-daily-upgrade.timer \
  e2scrub_all.timer e2scrub_reap.service fstrim.timer; do
  ln -sf /dev/null "$tmp/etc/systemd/system/$u"
done
: >"$tmp/etc/machine-id"
rm -rf "$tmp/var/cache/apt/archives/"*.deb "$tmp/var/lib/apt/lists/"* 2>/dev/null || true

mv "$tmp" "$OUT/rootfs"
printf '%s' "$VERSION" >"$OUT/rootfs.stamp"
echo "build.sh: done: $OUT/rootfs" >&2
