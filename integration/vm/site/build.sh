#!/usr/bin/env bash
# Build the site VM's disk: a Debian 12 (bookworm) root filesystem with
# systemd as PID 1, D-Bus, sshd, Podman (runc, conmon) and the host's cloud
# kernel modules, as one ext4 image that QEMU boots with the host's cloud
# kernel and initrd (integration/vm/site/up). A physical-mode site runs
# inside it: there we are the kernel (memlock, hugepages, NVMe, modules).
#
# Usage: build.sh OUT_DIR      (as root; needs debootstrap, the Debian mirror,
#                               linux-image-cloud-amd64, e2fsprogs)
# Result: OUT_DIR/site.img (ext4, label gpuq-site), OUT_DIR/id_site (the key
# root logs in with), OUT_DIR/known_hosts, OUT_DIR/site.stamp (written last:
# the hash of this script and the kernel version). Does nothing when the
# stamp matches. Concurrent callers wait on OUT_DIR/.lock.
# Mirror: $GPUQ_DEBIAN_MIRROR, else the first Debian URI in
# /etc/apt/sources.list*, else http://deb.debian.org/debian.
set -euo pipefail

OUT=${1:?usage: build.sh OUT_DIR}
HERE=$(cd "$(dirname "$0")" && pwd)
KVER=$(ls /lib/modules | grep -- '-cloud-amd64$' | sort -V | tail -n1 || true)
# debootstrap's own resolver installs the base; apt (in the tree) the rest,
# with their dependencies (debootstrap alone fails to configure podman's).
BASE=systemd,systemd-sysv,dbus,procps,passwd,iproute2,kmod,util-linux,e2fsprogs,openssh-server,libudev1,libblkid1
PACKAGES="podman runc conmon uidmap curl openssh-client"

if [ "$(id -u)" != 0 ]; then
  echo "build.sh: run as root (debootstrap creates device nodes and owners)" >&2
  exit 1
fi
for t in debootstrap mkfs.ext4 ssh-keygen; do
  command -v "$t" >/dev/null || { echo "build.sh: $t is not installed (integration/install-deps)" >&2; exit 1; }
done
[ -n "$KVER" ] && [ -r "/boot/vmlinuz-$KVER" ] && [ -r "/boot/initrd.img-$KVER" ] || {
  echo "build.sh: no cloud kernel with its initrd in /boot (apt-get install linux-image-cloud-amd64)" >&2
  exit 1
}

STAMP="site-vm v1 $(sha256sum "$0" | cut -c1-16) kernel $KVER"
mkdir -p "$OUT"
exec 9>"$OUT/.lock"
flock 9
if [ -f "$OUT/site.stamp" ] && [ "$(cat "$OUT/site.stamp")" = "$STAMP" ] && [ -s "$OUT/site.img" ]; then
  exit 0
fi

mirror=$("$(dirname "$0")/../../debian-mirror")

rm -f "$OUT/site.stamp"
tree="$OUT/rootfs.new"
cleanup() {
  # debootstrap can leave the target's /proc or /sys mounted: unmount
  # whatever is below the tree, deepest first, before removing it.
  findmnt -rn -o TARGET | { grep -F "$tree/" || true; } | sort -r | while read -r m; do umount "$m" || true; done
  rm -rf "$tree"
}
trap cleanup EXIT
cleanup
echo "build.sh: debootstrap bookworm from $mirror (about 3-5 minutes)" >&2
if ! debootstrap --variant=minbase --include="$BASE" bookworm "$tree" "$mirror" >"$OUT/debootstrap.log" 2>&1; then
  tail -n 30 "$OUT/debootstrap.log" >&2
  echo "build.sh: debootstrap failed (full log: $OUT/debootstrap.log)" >&2
  exit 1
fi
findmnt -rn -o TARGET | { grep -F "$tree/" || true; } | sort -r | while read -r m; do umount "$m"; done
echo "build.sh: apt-get install $PACKAGES in the tree" >&2
cp /etc/resolv.conf "$tree/etc/resolv.conf" 2>/dev/null || true
# shellcheck disable=SC2086
if ! chroot "$tree" env DEBIAN_FRONTEND=noninteractive LC_ALL=C \
    sh -c "apt-get update -qq && apt-get install -y -qq --no-install-recommends $PACKAGES" >>"$OUT/debootstrap.log" 2>&1; then
  tail -n 30 "$OUT/debootstrap.log" >&2
  echo "build.sh: apt-get in the tree failed (full log: $OUT/debootstrap.log)" >&2
  exit 1
fi
rm -f "$tree/etc/resolv.conf"
findmnt -rn -o TARGET | { grep -F "$tree/" || true; } | sort -r | while read -r m; do umount "$m"; done

# The kernel's modules (virtio-net, overlay, veth, nvmet ...): the guest
# runs the host's cloud kernel.
mkdir -p "$tree/lib/modules"
cp -a "/lib/modules/$KVER" "$tree/lib/modules/"

# Root logs in over the forwarded ssh port with this key only.
rm -f "$OUT/id_site" "$OUT/id_site.pub"
ssh-keygen -q -t ed25519 -N '' -C gpuq-site-vm -f "$OUT/id_site"
install -d -m 0700 "$tree/root/.ssh"
install -m 0600 "$OUT/id_site.pub" "$tree/root/.ssh/authorized_keys"
rm -f "$tree"/etc/ssh/ssh_host_*
ssh-keygen -q -t ed25519 -N '' -C gpuq-site-vm-host -f "$tree/etc/ssh/ssh_host_ed25519_key"
printf '[127.0.0.1]:*,[localhost]:* %s\n' "$(cut -d' ' -f1,2 "$tree/etc/ssh/ssh_host_ed25519_key.pub")" >"$OUT/known_hosts"
cat >"$tree/etc/ssh/sshd_config.d/gpuq-site.conf" <<'CONF'
PermitRootLogin prohibit-password
PasswordAuthentication no
HostKey /etc/ssh/ssh_host_ed25519_key
UseDNS no
CONF

# The OS disk, the network (QEMU's user network: DHCP), the console.
echo 'LABEL=gpuq-site / ext4 rw,discard,errors=remount-ro 0 1' >"$tree/etc/fstab"
echo gpuq-site >"$tree/etc/hostname"
mkdir -p "$tree/etc/systemd/network"
cat >"$tree/etc/systemd/network/10-user.network" <<'CONF'
[Match]
Name=en* eth*
[Network]
DHCP=ipv4
CONF
ln -sf /lib/systemd/system/systemd-networkd.service "$tree/etc/systemd/system/multi-user.target.wants/systemd-networkd.service"
ln -sf /lib/systemd/system/ssh.service "$tree/etc/systemd/system/multi-user.target.wants/ssh.service"
# No timers, no time sync, no resolver (nothing outside is reachable).
for u in getty@tty1.service systemd-timesyncd.service systemd-resolved.service apt-daily.timer \
  apt-daily-upgrade.timer e2scrub_all.timer e2scrub_reap.service fstrim.timer man-db.timer \
  podman-auto-update.timer podman-restart.service; do
  ln -sf /dev/null "$tree/etc/systemd/system/$u"
done
: >"$tree/etc/machine-id"
rm -rf "$tree/var/cache/apt/archives/"*.deb "$tree/var/lib/apt/lists/"* 2>/dev/null || true

# The image: the tree plus room for containers, images and job data.
used=$(du -sm --apparent-size "$tree" | cut -f1)
size=$(( used + 3072 ))
rm -f "$OUT/site.img.new"
truncate -s "${size}M" "$OUT/site.img.new"
mkfs.ext4 -q -F -L gpuq-site -d "$tree" "$OUT/site.img.new"
mv "$OUT/site.img.new" "$OUT/site.img"
printf '%s' "$KVER" >"$OUT/kernel"
printf '%s' "$STAMP" >"$OUT/site.stamp"
echo "build.sh: done: $OUT/site.img (${size} MiB, kernel $KVER)" >&2
