#!/usr/bin/env bash
# Build (or reuse) promtool from source through the Go module proxy, cached by version
# outside the work tree. Progress goes to stderr; the last line printed on stdout is the
# path of the promtool binary (tests/unit/deploy/test_monitoring.py and the e2e test
# tests/e2e/test_monitoring.py run it through testbed/monitoring.py).
set -euo pipefail
build_name=promtool
# shellcheck source=hack/lib/build.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/build.sh"

# Prometheus tags its Go module v0.<major*100+minor>.<patch>: v0.316.0 is Prometheus 3.16.0.
version=${PROMTOOL_VERSION:-v0.316.0}
# remove_all_sd: Prometheus's own build tag that leaves out the service discoveries of
# plugins/plugin_*.go (AWS, Azure, GCE, ...), which the tests never use: 247 of promtool's
# 1,364 packages, the cloud SDKs among them (`go list -deps`). The tag is part of the
# cache key: it changes the binary.
tags=remove_all_sd
out="$cache_root/promtool/$version-$tags"

if [[ -x $out/promtool ]]; then
  log "reusing cached promtool $version"
  echo "$out/promtool"
  exit 0
fi
start_build "$out" "promtool $version" "promtool $version" "holding a promtool binary" promtool
log "building promtool $version from source (a cold build takes many minutes) ..."
start=$SECONDS
# `go install` of a module version builds it with exactly its own go.mod; GOBIN puts the
# binary in the scratch directory first, so a killed build leaves no half-written promtool.
GOBIN="$tmp" GOFLAGS="$GOFLAGS -mod=mod" go install \
  -tags "$tags" -ldflags "-s -w" \
  "github.com/prometheus/prometheus/cmd/promtool@$version"
mv "$tmp/promtool" "$out/promtool"
log "built promtool $version in $((SECONDS - start))s"
echo "$out/promtool"
