#!/usr/bin/env bash
# Build (or reuse) the product's OCI image with no Docker engine and no image registry.
#
#   base:    Debian bookworm's own python3 (3.11, the minor of python:3.11-slim) with a
#            virtualenv on PATH, made by mmdebstrap from the Debian mirror and committed
#            by buildah into a private image store; it stands in for python:3.11-slim.
#   product: the Dockerfile itself, built by `buildah bud` on that base (PYTHON_IMAGE),
#            so the image follows the Dockerfile's recipe step for step.
#
# Both are cached outside the work tree: the base by its recipe and the Debian suites'
# release dates, the image by the base and a digest of the files the Dockerfile copies,
# so a product change rebuilds only the top layer. The last line printed is the path of
# an oci-archive that `ctr -n k8s.io images import` names localhost/composable-dra:TAG.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
build_name=image
# shellcheck source=hack/lib/build.sh
source "$here/../lib/build.sh"

image_name=localhost/composable-dra
mirror=${DEBIAN_MIRROR:-http://deb.debian.org}
suite=bookworm
# Only what the Dockerfile's steps need: python3 with venv/pip, CA certificates for TLS,
# passwd for useradd. merged-usr satisfies usrmerge's alternative without pulling perl.
packages=python3-venv,ca-certificates,passwd
sources=(
  "deb $mirror/debian $suite main"
  "deb $mirror/debian $suite-updates main"
  "deb $mirror/debian-security $suite-security main"
)
venv=/opt/venv
# The base's recipe; all of it is part of the base's cache key. No documentation but the
# licences.
mmdebstrap_args=(
  --variant=apt --include="$packages" --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright'
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*'
  --dpkgopt='path-exclude=/usr/share/locale/*'
  --customize-hook="chroot \"\$1\" python3 -m venv $venv"
)
# What python:3.11-slim's config sets, with the virtualenv's pip and python first.
base_config=(
  --env "PATH=$venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
  --env LANG=C.UTF-8 --cmd python3
)

# suite_epochs: each suite's InRelease Date (seconds since the epoch), which changes
# whenever one of its packages does.
suite_epochs() {
  local src url s release
  for src in "${sources[@]}"; do
    read -r _ url s _ <<<"$src"
    release=$(curl -fsS --max-time 30 "$url/dists/$s/InRelease")
    echo "$s $(date -u -d "$(grep -m1 '^Date:' <<<"$release" | cut -d: -f2-)" +%s)"
  done
}

# copied_digest: a digest of every file the Dockerfile COPYs (its sources, read from the
# Dockerfile), of the Dockerfile and .dockerignore, and of this script.
copied_digest() {
  local sources
  # (COPY --from=STAGE copies from a stage, not from the context.)
  sources=$(awk '$1 == "COPY" && !/--from=/ { for (i = 2; i < NF; i++) if ($i !~ /^--/) print $i }' \
    "$repo/Dockerfile")
  # shellcheck disable=SC2086  # word splitting: one path per COPY source
  (cd "$repo" && find $sources Dockerfile .dockerignore -type f \
    ! -path '*/__pycache__/*' ! -name '*.pyc' -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
    sha256sum "$here/build.sh" | cut -d' ' -f1) | sha256sum | cut -c1-12
}

apt_install_missing buildah mmdebstrap umoci runc
version=$(awk -F'"' '/^version *=/ { print $2; exit }' "$repo/pyproject.toml")
[[ -n $version ]] || { log "cannot read the version from $repo/pyproject.toml"; exit 1; }
out_dir="$cache_root/image"
store="$out_dir/storage"
mkdir -p "$out_dir"

if epochs=$(suite_epochs 2>/dev/null); then
  base_key=$(printf '%s\n' "${sources[@]}" "${mmdebstrap_args[@]}" "${base_config[@]}" "$epochs" |
    sha256sum | cut -c1-12)
  # The newest suite's date stamps the base's files: the same inputs give the same rootfs.
  base_epoch=$(sort -k2n <<<"$epochs" | tail -n1 | cut -d' ' -f2)
  echo "$base_key $base_epoch" >"$out_dir/base-key"
  log "Debian suites: $(while read -r s e; do echo "$s $(date -u -d "@$e" +%FT%TZ)"; done <<<"$epochs" | paste -sd,)"
elif [[ -s $out_dir/base-key ]]; then
  read -r base_key base_epoch <"$out_dir/base-key"
  log "cannot read the Debian suites' dates from $mirror; reusing the last base ($base_key)"
else
  log "ERROR: cannot reach the Debian mirror $mirror (set DEBIAN_MIRROR) and no base is cached"
  exit 1
fi
product_key=$(copied_digest)
tag="$version-$(printf '%s %s' "$base_key" "$product_key" | sha256sum | cut -c1-12)"
archive="$out_dir/composable-dra_$tag.oci.tar"
if [[ -s $archive ]]; then
  log "reusing cached image $image_name:$tag"
  echo "$archive"
  exit 0
fi

tmp=$(mktemp -d "$out_dir/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# A private store (vfs: no overlay or fuse needed) and chroot isolation (no cgroup or
# namespace setup beyond chroot), which work on cgroup v1 hosts without CAP_SYS_RESOURCE.
store_flags=(--root "$store/root" --runroot "$store/run" --storage-driver vfs)
b() { buildah "${store_flags[@]}" "$@"; }
export BUILDAH_ISOLATION=chroot
start=$SECONDS

base_image="$image_name-base:$suite-$base_key"
if ! b inspect --type image "$base_image" >/dev/null 2>&1; then
  t0=$SECONDS
  log "building the base $base_image with mmdebstrap (a cold build takes about 2 minutes) ..."
  SOURCE_DATE_EPOCH=$base_epoch nice -n 10 mmdebstrap --quiet "${mmdebstrap_args[@]}" \
    "$suite" "$tmp/rootfs.tar" "${sources[@]}" >&2
  ctr=$(b from scratch)
  b add "$ctr" "$tmp/rootfs.tar" / >/dev/null
  b config "${base_config[@]}" "$ctr"
  b commit --quiet --rm --identity-label=false --timestamp "$base_epoch" "$ctr" "$base_image" >/dev/null
  rm -f "$tmp/rootfs.tar"
  # Earlier bases are superseded: drop them from the store.
  for old in $(b images --format '{{.Name}}:{{.Tag}}' | grep -F "$image_name-base:"); do
    [[ $old == "$base_image" ]] || b rmi "$old" >/dev/null || true
  done
  log "built the base in $((SECONDS - t0))s"
fi

t0=$SECONDS
log "building $image_name:$tag from the Dockerfile with buildah ..."
revision=$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)
volumes=()
# The build stage's pip trusts what this machine trusts (an egress proxy's CA, say);
# a RUN volume is not committed, so none of it enters the image.
[[ -r /etc/ssl/certs/ca-certificates.crt ]] &&
  volumes=(--volume /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro)
nice -n 10 buildah "${store_flags[@]}" bud \
  --quiet --layers=false --identity-label=false "${volumes[@]}" \
  --build-arg PYTHON_IMAGE="$base_image" --build-arg VERSION="$version" \
  --build-arg REVISION="$revision" --tag "$image_name:$tag" --file "$repo/Dockerfile" "$repo" >&2
b push --quiet "$image_name:$tag" "oci-archive:$tmp/image.tar:$image_name:$tag"
# The archive is the cache; the store keeps only the base.
b rmi "$image_name:$tag" >/dev/null
b rmi --prune >/dev/null 2>&1 || true
mv "$tmp/image.tar" "$archive"
# Keep the three newest images (other work trees may be using them).
find "$out_dir" -maxdepth 1 -name 'composable-dra_*.oci.tar' -printf '%T@ %p\n' | sort -rn |
  tail -n +4 | cut -d' ' -f2- | xargs -r rm -f
log "built $image_name:$tag in $((SECONDS - t0))s ($((SECONDS - start))s in all), $(du -h "$archive" | cut -f1)"
echo "$archive"
