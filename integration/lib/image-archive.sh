# Sourced by the test images' build scripts (integration/daos-sim-image,
# integration/mkfs-image): one root directory becomes a one-layer
# docker-archive tar, from scratch, without a registry and without
# `podman build`. Tar entries have fixed owners and mtimes and the config
# a fixed date, so the same files give the same image ID (the SHA-256 of
# the config blob).

# Copy the libraries `ldd BIN` names into ROOT at their own paths.
#   copy_libs BIN ROOT
copy_libs() {
  local lib
  for lib in $(ldd "$1" | grep -o '/[^ ]*'); do
    mkdir -p "$2$(dirname "$lib")"
    cp -L "$lib" "$2$lib"
  done
}

# Write OUT/NAME.tar (the image: ROOT as its one layer, CONFIG the image
# config's "config" object, REPO_TAG its name, CREATED_BY its history)
# and OUT/image-id, each by a rename of its own (concurrent builds write
# the same bytes and never see each other's half-written files); WORK is
# a scratch directory. Prints `archive: PATH` and `image: sha256:HEX`.
#   image_archive ROOT WORK OUT NAME REPO_TAG CONFIG CREATED_BY
image_archive() {
  local root=$1 work=$2 out=$3 name=$4 tag=$5 cfg=$6 by=$7 layer config arch=amd64
  [ "$(uname -m)" = aarch64 ] && arch=arm64
  find "$root" -exec touch -h -d @0 {} +
  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --format=gnu \
    -C "$root" -cf "$work/layer.tar" $(cd "$root" && ls -A)
  layer=$(sha256sum "$work/layer.tar" | cut -d' ' -f1)
  printf '%s' "{\"architecture\":\"$arch\",\"os\":\"linux\",\"created\":\"1970-01-01T00:00:00Z\",\
\"config\":$cfg,\
\"rootfs\":{\"type\":\"layers\",\"diff_ids\":[\"sha256:$layer\"]},\
\"history\":[{\"created\":\"1970-01-01T00:00:00Z\",\"created_by\":\"$by\"}]}" \
    >"$work/config.json"
  config=$(sha256sum "$work/config.json" | cut -d' ' -f1)
  mkdir -p "$work/outer" "$out"
  mv "$work/layer.tar" "$work/outer/$layer.tar"
  mv "$work/config.json" "$work/outer/$config.json"
  printf '%s' "[{\"Config\":\"$config.json\",\"RepoTags\":[\"$tag\"],\"Layers\":[\"$layer.tar\"]}]" \
    >"$work/outer/manifest.json"
  touch -d @0 "$work/outer"/*
  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --format=gnu \
    -C "$work/outer" -cf "$out/.$name.tar.$$" manifest.json "$config.json" "$layer.tar"
  mv "$out/.$name.tar.$$" "$out/$name.tar"
  echo "sha256:$config" >"$out/.image-id.$$"
  mv "$out/.image-id.$$" "$out/image-id"
  echo "archive: $out/$name.tar"
  echo "image: sha256:$config"
}
