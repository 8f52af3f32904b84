#!/usr/bin/env bash
# Builds the daos-sim test image — DAOS control-plane simulator for tests;
# not DAOS — as a docker-archive tar, from scratch, without a registry and
# without `podman build`: one layer with the static daos-sim binary, a static
# busybox (Debian's busybox-static) and symlinks; config and manifest written
# here. The image ID is the SHA-256 of the config blob; tar entries have fixed
# owners and mtimes, so the same binary gives the same ID.
#
# usage: build.sh [--bin PATH] [--out DIR]
#   --bin PATH  use this daos-sim binary instead of building the static one
#               (a dynamically linked one gets its ldd libraries copied in)
#   --out DIR   where daos-sim-image.tar and image-id go
#               (default: $CARGO_TARGET_DIR or ./target, then /daos-sim-image)
# Prints `archive: PATH` and `image: sha256:HEX` (also written to DIR/image-id).
#
# Load it: `podman load -i DIR/daos-sim-image.tar`, or the libpod API
# `POST /libpod/images/load` with the tar as body; refer to it by the ID.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
. "$repo/integration/lib/image-archive.sh"
bin=""
out=""
while [ $# -gt 0 ]; do
    case "$1" in
        --bin) bin=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "build.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
target_dir=${CARGO_TARGET_DIR:-$repo/target}
if [ -z "$bin" ]; then
    # A build started from a test inherits that test's cargo variables
    # (CARGO_MANIFEST_DIR, CARGO_PKG_*: each test crate its own). ring's
    # build script reruns when CARGO_MANIFEST_DIR changes, so every caller
    # in turn — the cluster tests, the site VM, the benchmarks, the image
    # test — rebuilt ring, rustls and the simulator (about 60 s of CPU and
    # 100 s each time; docs/testing.md, "Time"). The build sees none of them.
    # Nor tests/run's clippy wrapper: its lints ran on this crate in the
    # debug build already (the wrapper's path is part of cargo's hash).
    for v in $(compgen -e); do
        case $v in
            CARGO_HOME | CARGO_TARGET_DIR | CARGO_TERM_COLOR) ;;
            CARGO_* | RUSTC_WORKSPACE_WRAPPER | CLIPPY_ARGS) unset "$v" ;;
        esac
    done
    # The documented static build (glibc, static-pie).
    (cd "$repo" && RUSTFLAGS="-C target-feature=+crt-static" \
        "${CARGO:-cargo}" build -p daos-sim --release --target x86_64-unknown-linux-gnu)
    bin=$target_dir/x86_64-unknown-linux-gnu/release/daos-sim
fi
out=${out:-$target_dir/daos-sim-image}
busybox=${BUSYBOX:-/bin/busybox}
[ -x "$bin" ] || { echo "build.sh: no daos-sim binary at $bin" >&2; exit 1; }
[ -x "$busybox" ] || { echo "build.sh: $busybox missing (apt-get install busybox-static)" >&2; exit 1; }
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$repo/Cargo.toml" | head -1)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
root=$work/rootfs
mkdir -p "$root"/{bin,etc/daos,tmp,root,var/run/daos_agent,var/lib,var/tmp,run,dev,proc,sys}
chmod 1777 "$root/tmp" "$root/var/tmp"
cp "$bin" "$root/bin/daos-sim"
if command -v strip >/dev/null; then strip "$root/bin/daos-sim"; fi
cp "$busybox" "$root/bin/busybox"
for name in daos_server daos_agent dmg daos; do ln -s daos-sim "$root/bin/$name"; done
for applet in sh ash cat cp df du echo env false find grep head hostname id ip kill \
    ln ls mkdir mv nc netstat ps pwd readlink rm sed sleep stat tail tee test touch \
    tr true uname wc which xargs; do
    ln -s busybox "$root/bin/$applet"
done
# The real DAOS image has bash, and users' scripts (the seed's daos-exec
# example: `bash -euc '...'`) call it; here busybox's POSIX sh stands in.
printf '#!/bin/sh\n# daos-sim image: bash is busybox sh here (the real DAOS image has bash)\nexec /bin/sh "$@"\n' >"$root/bin/bash"
chmod 755 "$root/bin/bash"
# A dynamically linked binary (tests use the debug build): bring its libraries.
if ldd "$bin" >/dev/null 2>&1; then copy_libs "$bin" "$root"; fi
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$root/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"

image_archive "$root" "$work" "$out" daos-sim-image "localhost/gpuq-daos-sim:$version" \
    "{\"Env\":[\"PATH=/bin\"],\"Cmd\":[\"dmg\",\"--help\"],\
\"Labels\":{\"io.gpuq.image\":\"daos-sim\",\"io.gpuq.daos-sim.version\":\"$version\",\
\"description\":\"DAOS control-plane simulator for tests; not DAOS\"}}" \
    integration/daos-sim-image/build.sh
