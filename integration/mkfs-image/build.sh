#!/usr/bin/env bash
# Builds the test sites' mkfs image for `--stor nfsrdma` (#18): this host's
# own `mkfs.xfs` (Debian's xfsprogs) and the libraries `ldd` names, in one
# layer, as a docker-archive tar, from scratch, without a registry and
# without `podman build`. The node helper runs `mkfs.xfs -K DEVICE` in it
# through the libpod API (docs/stor-research.md §10). Tar entries have
# fixed owners and mtimes, so the same binaries give the same image ID (the
# SHA-256 of the config blob). A site builds its own from
# containerfiles/Containerfile.mkfs and pins that ID instead.
#
# usage: build.sh [--out DIR]   (default: $CARGO_TARGET_DIR or ./target, then /mkfs-image)
# Prints `archive: PATH` and `image: sha256:HEX` (also written to DIR/image-id).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
. "$repo/integration/lib/image-archive.sh"
out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift 2 ;;
    *) echo "build.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
out=${out:-${CARGO_TARGET_DIR:-$repo/target}/mkfs-image}
mkfs=$(command -v mkfs.xfs || true)
[ -n "$mkfs" ] || { echo "build.sh: no mkfs.xfs on this host (apt-get install xfsprogs)" >&2; exit 1; }
version=$(dpkg-query -W -f '${Version}' xfsprogs 2>/dev/null || echo unknown)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
root=$work/rootfs
mkdir -p "$root"/{sbin,etc,tmp,dev,proc,sys}
chmod 1777 "$root/tmp"
cp -L "$mkfs" "$root/sbin/mkfs.xfs"
copy_libs "$mkfs" "$root"
printf 'root:x:0:0:root:/:/sbin/nologin\n' >"$root/etc/passwd"
printf 'root:x:0:\n' >"$root/etc/group"
image_archive "$root" "$work" "$out" mkfs-image "localhost/gpuq-mkfs:xfsprogs-$version" \
  "{\"Env\":[\"PATH=/sbin\"],\"Cmd\":[\"mkfs.xfs\",\"-V\"],\
\"Labels\":{\"io.gpuq.image\":\"mkfs\",\"io.gpuq.mkfs.xfsprogs\":\"$version\"}}" \
  integration/mkfs-image/build.sh
