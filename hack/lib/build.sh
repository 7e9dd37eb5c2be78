# shellcheck shell=bash disable=SC2034
# (SC2034: cache_root, missing and tmp are for the sourcing script.)
# Shared steps of the hack/*/build.sh scripts, which source this file after setting
# `build_name` (their log prefix). Each builds Go binaries through the module proxy into
# a directory cached by version outside the work tree.

log() { printf '[%s] %s\n' "${build_name:?}" "$*" >&2; }

# module_version GO_MOD MODULE: the version GO_MOD requires of MODULE (the wrapper modules
# pin the versions, so a version bump is a go.mod edit).
module_version() { grep -oE "^\s*(require )?$2 v[^ ]+" "$1" | awk '{print $NF}'; }

cache_root=${COMPOSABLE_DRA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/composable-dra}

# apt_install_missing COMMAND...: install with apt-get (as root) the Debian packages of the
# same names as the COMMANDs not on PATH; without root or apt-get, say what to install.
apt_install_missing() {
  local need=() c
  for c in "$@"; do command -v "$c" >/dev/null 2>&1 || need+=("$c"); done
  ((${#need[@]} == 0)) && return 0
  if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
    log "ERROR: ${need[*]} missing; install (Debian/Ubuntu: apt-get install ${need[*]}) and retry."
    exit 1
  fi
  log "installing ${need[*]} with apt-get ..."
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}" >&2; then
    apt-get update -q >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}" >&2
  fi
}

# start_build OUT CACHED WHAT HOLDS BINARY...: sets `missing` to the binaries OUT lacks.
# With none missing it prints OUT and exits ("reusing cached CACHED"). Otherwise it needs
# Go (to build WHAT; HOLDS names where a prebuilt OUT would be), makes the scratch
# directory `tmp` inside OUT (so the final mv is a rename) and static, path-free Go flags.
start_build() {
  local out=$1 cached=$2 what=$3 holds=$4 b
  shift 4
  missing=()
  for b in "$@"; do [[ -x "$out/$b" ]] || missing+=("$b"); done
  if ((${#missing[@]} == 0)); then
    log "reusing cached $cached"
    echo "$out"
    exit 0
  fi
  if ! command -v go >/dev/null 2>&1; then
    log "ERROR: Go is not installed or not on PATH; Go >= 1.26 is needed to build $what."
    log "Install it from your distribution or https://go.dev/dl, or set COMPOSABLE_DRA_CACHE to a"
    log "directory $holds"
    exit 1
  fi
  mkdir -p "$out"
  tmp=$(mktemp -d "$out/.build.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  export CGO_ENABLED=0 GOFLAGS="${GOFLAGS:-} -trimpath"
}

# k8s_ldflags VERSION: the -X flags that stamp a Kubernetes binary with VERSION, as the
# upstream release build does, so that `--version` and the API's /version report it.
k8s_ldflags() {
  local version=$1 minor pkg flags="" build_date
  minor=${version#v1.}
  minor=${minor%%.*}
  build_date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    flags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    flags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$build_date"
  done
  echo "$flags"
}
