#!/bin/sh
# PID 1 of the systemd box for a moment: make sure systemd gets a cgroup v2
# hierarchy of its own, then become systemd (`exec /sbin/init`).
#
# On a host in cgroup v1 or hybrid mode, Podman gives the container only the
# v1 hierarchies (a tmpfs at /sys/fs/cgroup). systemd then runs in legacy
# mode and learns that a unit's cgroup became empty only from the v1 release
# agent, which never reaches a container: a unit whose processes were all
# SIGKILLed stays "deactivating (stop-sigterm)" until TimeoutStopSec. Mounting
# the container's own cgroup2 hierarchy (cgroup namespace: its subtree only)
# at /sys/fs/cgroup/unified puts systemd in hybrid mode, where it watches
# cgroup.events. On a pure cgroup v2 host /sys/fs/cgroup is already cgroup2
# and nothing is done.
set -e
if [ "$(stat -f -c %T /sys/fs/cgroup)" = tmpfs ] && ! mountpoint -q /sys/fs/cgroup/unified; then
  mkdir -p /sys/fs/cgroup/unified
  mount -t cgroup2 -o nsdelegate cgroup2 /sys/fs/cgroup/unified
fi
exec /sbin/init "$@"
