#!/bin/busybox sh
# Second stage of the VM test guest, running with "/" on an emulated NVMe
# namespace (read-only ext4): the disk holding the root filesystem must be
# refused as os_disk.
export PATH=/bin:/sbin
. /lib/gpuq-guest-lib.sh
N8=$1
echo "GPUQ-INFO root stage on $N8"
cfg root_disk 'serial = "SN-GPUQ-0008"\npci = "0000:00:17.0"'
run root_disk "$N8" wipe --lease vm-1
echo "GPUQ-DONE"
sync
poweroff -f
