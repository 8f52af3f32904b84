#!/usr/bin/env bash
# Build the initramfs for the block-device VM tests.
#   build-initramfs.sh OUT.cpio.gz GPUQ_NODE_BINARY KERNEL_VERSION [ROOTFS.img]
# With ROOTFS.img, the same tree is also written into that image as an ext4
# filesystem (mkfs.ext4 -d): the guest switches its root to it for the
# "disk holding the root filesystem" scenario (/init2).
# Contents: busybox (static), our dynamically linked gpuq-node with the
# libraries ldd lists, mdadm and dmsetup likewise, the kernel modules the
# tests need (dm-mod, md-mod, raid1, virtio-blk) and guest-init.sh as /init.
set -euo pipefail
OUT=$1 BIN=$2 KVER=$3
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(mktemp -d)
trap 'rm -rf "$ROOT"' EXIT

mkdir -p "$ROOT"/{bin,sbin,proc,sys,dev,run,tmp,boot,var/tmp,gpuq,lib/modules}

copy_with_libs() { # binary dest-path
    install -D -m 0755 "$1" "$ROOT$2"
    # A static binary makes ldd fail: nothing to copy then.
    { ldd "$1" 2>/dev/null || true; } | awk '/=>/ {print $3} /^[ \t]*\/lib/ {print $1}' |
        while read -r lib; do
            [ -n "$lib" ] && [ -e "$lib" ] || continue
            install -D -m 0755 "$(readlink -f "$lib")" "$ROOT$lib"
        done
}
copy_with_libs "$(command -v busybox)" /bin/busybox
copy_with_libs "$BIN" /gpuq/gpuq-node
copy_with_libs "$(command -v mdadm)" /sbin/mdadm
copy_with_libs "$(command -v dmsetup)" /sbin/dmsetup
# The dynamic loader, by the path the binaries ask for.
install -D -m 0755 /lib64/ld-linux-x86-64.so.2 "$ROOT/lib64/ld-linux-x86-64.so.2"

M=/lib/modules/$KVER
: > "$ROOT/lib/modules/order"
for m in kernel/drivers/md/dm-mod.ko kernel/drivers/md/md-mod.ko kernel/drivers/md/raid1.ko \
         kernel/drivers/virtio/virtio_ring.ko kernel/drivers/virtio/virtio.ko \
         kernel/drivers/virtio/virtio_pci_legacy_dev.ko kernel/drivers/virtio/virtio_pci_modern_dev.ko \
         kernel/drivers/virtio/virtio_pci.ko kernel/drivers/block/virtio_blk.ko; do
    if [ -e "$M/$m" ]; then
        install -D -m 0644 "$M/$m" "$ROOT/lib/modules/$(basename "$m")"
        basename "$m" >> "$ROOT/lib/modules/order"
    fi
done
install -m 0755 "$HERE/guest-init.sh" "$ROOT/init"
install -m 0755 "$HERE/guest-root-stage.sh" "$ROOT/init2"
install -m 0644 "$HERE/guest-lib.sh" "$ROOT/lib/gpuq-guest-lib.sh"
# Applet links, so that the read-only second stage has them too.
for a in $("$ROOT/bin/busybox" --list); do
    [ -e "$ROOT/bin/$a" ] || ln -s busybox "$ROOT/bin/$a"
done
mkdir -p "$ROOT/newroot"
if [ -n "${4:-}" ]; then
    mkfs.ext4 -q -F -d "$ROOT" "$4"
fi
(cd "$ROOT" && find . | cpio -o -H newc --quiet | gzip -1) > "$OUT"
