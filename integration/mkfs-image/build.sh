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
for lib in $(ldd "$mkfs" | grep -o '/[^ ]*'); do
  mkdir -p "$root$(dirname "$lib")"
  cp -L "$lib" "$root$lib"
done
printf 'root:x:0:0:root:/:/sbin/nologin\n' >"$root/etc/passwd"
printf 'root:x:0:\n' >"$root/etc/group"
find "$root" -exec touch -h -d @0 {} +
tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --format=gnu \
  -C "$root" -cf "$work/layer.tar" $(cd "$root" && ls -A)
layer=$(sha256sum "$work/layer.tar" | cut -d' ' -f1)
printf '%s' "{\"architecture\":\"amd64\",\"os\":\"linux\",\"created\":\"1970-01-01T00:00:00Z\",\
\"config\":{\"Env\":[\"PATH=/sbin\"],\"Cmd\":[\"mkfs.xfs\",\"-V\"],\
\"Labels\":{\"io.gpuq.image\":\"mkfs\",\"io.gpuq.mkfs.xfsprogs\":\"$version\"}},\
\"rootfs\":{\"type\":\"layers\",\"diff_ids\":[\"sha256:$layer\"]},\
\"history\":[{\"created\":\"1970-01-01T00:00:00Z\",\"created_by\":\"integration/mkfs-image/build.sh\"}]}" \
  >"$work/config.json"
config=$(sha256sum "$work/config.json" | cut -d' ' -f1)
mkdir -p "$work/outer" "$out"
mv "$work/layer.tar" "$work/outer/$layer.tar"
mv "$work/config.json" "$work/outer/$config.json"
printf '%s' "[{\"Config\":\"$config.json\",\"RepoTags\":[\"localhost/gpuq-mkfs:xfsprogs-$version\"],\"Layers\":[\"$layer.tar\"]}]" \
  >"$work/outer/manifest.json"
touch -d @0 "$work/outer"/*
tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --format=gnu \
  -C "$work/outer" -cf "$out/.mkfs-image.tar.$$" manifest.json "$config.json" "$layer.tar"
mv "$out/.mkfs-image.tar.$$" "$out/mkfs-image.tar"
echo "sha256:$config" >"$out/.image-id.$$"
mv "$out/.image-id.$$" "$out/image-id"
echo "archive: $out/mkfs-image.tar"
echo "image: sha256:$config"
