#!/bin/busybox sh
# /init of the block-device test VM. Sets up md, dm, partitions and mounts
# on emulated NVMe namespaces, runs gpuq-node once per scenario and prints
# the results between fixed markers on the console for the Rust test
# (crates/gpuq-node/tests/vm.rs) to parse:
#   GPUQ-BEGIN <scenario>            then gpuq-node's JSON
#   GPUQ-END <scenario> <exit> <same|changed>   (first+last MiB hashed in the guest)
/bin/busybox --install -s /bin
export PATH=/bin:/sbin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tmpfs run /run
mount -t tmpfs tmp /tmp
mkdir -p /run/mdadm /var/tmp /boot
for m in $(cat /lib/modules/order); do insmod "/lib/modules/$m" 2>/dev/null; done
echo 8 > /proc/sys/kernel/printk 2>/dev/null; echo 1 > /proc/sys/kernel/printk

# Wait for the nine NVMe namespaces and the virtio disk.
i=0
while [ $i -lt 600 ]; do
    n=$(ls -d /sys/block/nvme*n1 2>/dev/null | wc -l)
    [ "$n" -ge 9 ] && [ -e /sys/block/vda ] && break
    sleep 0.1; i=$((i + 1))
done

. /lib/gpuq-guest-lib.sh

N1=$(ns SN-GPUQ-0001) N2=$(ns SN-GPUQ-0002) N3=$(ns SN-GPUQ-0003) N4=$(ns SN-GPUQ-0004)
N5=$(ns SN-GPUQ-0005) N6=$(ns SN-GPUQ-0006) N7=$(ns SN-GPUQ-0007) N9=$(ns SN-GPUQ-0009)
echo "GPUQ-INFO n1=$N1 n2=$N2 n3=$N3 n4=$N4 n5=$N5 n6=$N6 n7=$N7 n9=$N9 device-link=$(readlink /sys/block/$N1/device)"

E1='serial = "SN-GPUQ-0001"\npci = "0000:00:10.0"\nnsid = 1'
cfg inventory "$E1";                                  run inventory "$N1" devices
cfg serial_mismatch 'serial = "SN-WRONG-0009"\npci = "0000:00:10.0"'
run serial_mismatch "$N1" wipe --lease vm-1
cfg pci_mismatch 'serial = "SN-GPUQ-0001"\npci = "0000:00:11.0"'
run pci_mismatch "$N1" wipe --lease vm-1
cfg partitions 'serial = "SN-GPUQ-0002"\npci = "0000:00:11.0"'
run partitions "$N2" wipe --lease vm-1
mdadm --create /dev/md0 --level=1 --raid-devices=2 --metadata=1.2 --run --force --assume-clean "/dev/$N3" "/dev/$N4" > /dev/null 2>&1
cfg md_member 'serial = "SN-GPUQ-0003"\npci = "0000:00:12.0"'
run md_member "$N3" wipe --lease vm-1
DM_DISABLE_UDEV=1 dmsetup create gpuqlin --table "0 2048 linear /dev/$N5 0" > /dev/null 2>&1
cfg dm_holder 'serial = "SN-GPUQ-0005"\npci = "0000:00:14.0"'
run dm_holder "$N5" wipe --lease vm-1
echo 0 > "/sys/block/$N6/queue/discard_max_bytes"
cfg no_discard 'serial = "SN-GPUQ-0006"\npci = "0000:00:15.0"'
run no_discard "$N6" wipe --lease vm-1
mount -t ext4 -o ro "/dev/$N7" /boot
cfg os_disk 'serial = "SN-GPUQ-0007"\npci = "0000:00:16.0"'
run os_disk "$N7" wipe --lease vm-1
cfg hdd 'serial = "HDD-GPUQ-0001"\npci = "0000:00:18.0"'
run hdd vda wipe --lease vm-1
# A drive that ignores deallocate (the host side is QEMU discard=ignore) and
# holds an ext4 this lease may leave behind: every check passes, BLKDISCARD
# succeeds, the verifying probe still finds the ext4 -> signature_after_wipe,
# exit 4; the audit record is printed too.
cfg ignored_discard 'serial = "SN-GPUQ-0009"\npci = "0000:00:19.0"'
run ignored_discard "$N9" wipe --lease vm-1 --expect-signature ext4
show_json ignored_discard_audit /run/jobs/vm-1/wipe-SN-GPUQ-0009.json
# Last: the real discard on a clean namespace (the host checks its file).
cfg clean "$E1"
run clean "$N1" wipe --lease vm-1
umount /boot 2>/dev/null
sync
# Second stage: make an NVMe namespace the root filesystem and check that
# gpuq-node refuses the disk holding "/" (guest-root-stage.sh).
N8=$(ns SN-GPUQ-0008)
if [ -n "$N8" ] && mount -t ext4 -o ro "/dev/$N8" /newroot; then
    mount -t tmpfs tmp /newroot/tmp
    for d in proc sys dev run; do mount -o move "/$d" "/newroot/$d"; done
    exec switch_root /newroot /init2 "$N8"
fi
echo "GPUQ-INFO no second stage (n8=$N8)"
echo "GPUQ-DONE"
poweroff -f
