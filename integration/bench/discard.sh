#!/usr/bin/env bash
# Benchmark: discard four 8 GiB sparse loop devices
#   A) concurrently, through `gpuq-node wipe` (all checks + BLKDISCARD + verify + audit)
#   B) with util-linux `blkdiscard`, one device after another
#   C) `gpuq-node wipe` of a single device (the "slowest single device" reference)
# Before every timed run each device gets DATA_MIB of data written at eight
# offsets, so that the discard has real extents to punch out of the backing
# files. Needs root, losetup, blkdiscard, dd; hyperfine if installed (else a
# plain loop with medians).
#
# Usage: sudo integration/bench/discard.sh [path/to/gpuq-node]
#   RUNS=5 DATA_MIB=512 SIZE_GIB=8 to tune.
# The script may run blkdiscard because it is the comparison; gpuq-node
# itself never runs an external destructive tool.
set -euo pipefail
. "$(dirname "$0")/lib-stop.sh"

BIN=${1:-target/release/gpuq-node}
RUNS=${RUNS:-5}
DATA_MIB=${DATA_MIB:-512}
SIZE_GIB=${SIZE_GIB:-8}
[ "$(id -u)" = 0 ] || { echo "discard.sh: needs root" >&2; exit 2; }
[ -x "$BIN" ] || { echo "discard.sh: no gpuq-node at $BIN (cargo build --release -p gpuq-node)" >&2; exit 2; }
BIN=$(realpath "$BIN")

WORK=$(mktemp -d /var/tmp/gpuq-bench.XXXXXX)
DEVS=()
cleanup() {
    # Detach exactly the loop devices this script created, by their paths.
    for d in "${DEVS[@]}"; do losetup -d "$d" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT INT TERM

cat > "$WORK/node.toml" <<TOML
[node]
name = "bench"
socket = "$WORK/node.sock"
podman_socket = "$WORK/podman.sock"
jobs_dir = "$WORK/jobs"
test_dir = "$WORK/test"
allow_loop_devices = true
TOML
cp "$WORK/node.toml" "$WORK/one.toml"
for i in 0 1 2 3; do
    f="$WORK/dev$i.img"
    truncate -s "${SIZE_GIB}G" "$f"
    d=$(losetup -f --show "$f")
    DEVS+=("$d")
    echo 0 > "/sys/block/$(basename "$d")/queue/rotational"
    printf '\n[[devices]]\nloop_backing_file = "%s"\n' "$f" >> "$WORK/node.toml"
    [ "$i" = 0 ] && printf '\n[[devices]]\nloop_backing_file = "%s"\n' "$f" >> "$WORK/one.toml"
done
chmod 600 "$WORK/node.toml" "$WORK/one.toml"

# Write DATA_MIB per device, spread over eight offsets.
cat > "$WORK/fill.sh" <<FILL
#!/bin/sh
set -e
chunk=\$(( $DATA_MIB / 8 ))
for d in $(printf '%s ' "${DEVS[@]}"); do
    for k in 0 1 2 3 4 5 6 7; do
        dd if=/dev/zero of=\$d bs=1M count=\$chunk seek=\$(( k * $SIZE_GIB * 128 )) oflag=direct conv=notrunc status=none
    done
done
sync
FILL
chmod +x "$WORK/fill.sh"

GPUQ_ALL="$BIN --config $WORK/node.toml wipe --lease bench"
GPUQ_ONE="$BIN --config $WORK/one.toml wipe --lease bench-one"
SERIAL="for d in ${DEVS[*]}; do blkdiscard \$d; done"
# Reference for what the kernel and the backing filesystem allow: the same
# four blkdiscard calls started at once.
PARALLEL="for d in ${DEVS[*]}; do blkdiscard \$d & done; wait"

echo "devices: ${DEVS[*]} (${SIZE_GIB} GiB sparse each, ${DATA_MIB} MiB written before each run)"
"$WORK/fill.sh"; du -sh "$WORK"/dev*.img | sed 's/^/allocated before: /'
$GPUQ_ALL > /dev/null
du -sh "$WORK"/dev*.img | sed 's/^/allocated after gpuq-node wipe: /'

if command -v hyperfine > /dev/null; then
    hyperfine --style basic --runs "$RUNS" --prepare "$WORK/fill.sh" \
        --export-json "$WORK/h.json" \
        -n "gpuq-node wipe, 4 devices concurrently" "$GPUQ_ALL > /dev/null" \
        -n "blkdiscard, 4 devices one after another" "$SERIAL" \
        -n "blkdiscard, 4 devices at once (reference)" "$PARALLEL" \
        -n "gpuq-node wipe, 1 device" "$GPUQ_ONE > /dev/null"
    python3 - "$WORK/h.json" <<'PY' || true
import json, sys
for r in json.load(open(sys.argv[1]))["results"]:
    print(f"median {r['median']*1000:8.1f} ms  {r['command']}")
PY
else
    for name in "$GPUQ_ALL" "$SERIAL" "$PARALLEL" "$GPUQ_ONE"; do
        ts=()
        for _ in $(seq "$RUNS"); do
            "$WORK/fill.sh"
            s=$(date +%s%N); bash -c "$name > /dev/null"; e=$(date +%s%N)
            ts+=($(( (e - s) / 1000000 )))
        done
        med=$(printf '%s\n' "${ts[@]}" | sort -n | sed -n "$(( (RUNS + 1) / 2 ))p")
        echo "median ${med} ms  $name"
    done
fi
