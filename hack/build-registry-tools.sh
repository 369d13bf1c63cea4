#!/usr/bin/env bash
# Build the registry tools the publishing scripts and their tests use, pinned, from the Go module
# proxy with the ordinary `go` client (no container engine, no prebuilt download):
#
#   hack/build-registry-tools.sh crane|registry ...
#
#   crane      github.com/google/go-containerregistry/cmd/crane   (pushes the OCI archive:
#              hack/publish-image.sh)
#   registry   github.com/distribution/distribution/v3/cmd/registry   (the CNCF distribution
#              registry: a real registry on loopback for tests/helm/test_publish.py)
#
# Each lands in ${XDG_CACHE_HOME:-$HOME/.cache}/dra-gateway/tools/<name>-<version>/<name>, as
# hack/build-node.sh caches its binaries: what exists is kept, a second run builds nothing.
# Progress goes to standard error; standard output gets one line per name: the binary's path.
set -euo pipefail

CRANE_VERSION=${CRANE_VERSION:-v0.22.1}
REGISTRY_VERSION=${REGISTRY_VERSION:-v3.1.2}
CACHE=${DRA_GATEWAY_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dra-gateway/tools}
export GOTOOLCHAIN=local GOFLAGS=-buildvcs=false CGO_ENABLED=0

log() { printf 'build-registry-tools: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

# go install package@version into $CACHE/<name>-<version>/ unless the binary is there.
build() {
  local name=$1 spec=$2 version=${2##*@}
  local dir=$CACHE/$name-$version
  if [[ -x $dir/$name ]]; then
    log "have $dir/$name"
  else
    command -v go >/dev/null ||
      die "go not found on PATH: $name is built from $spec with Go 1.26 or newer"
    local started=$SECONDS
    log "building $dir/$name"
    mkdir -p "$dir"
    rm -rf "$dir/bin.tmp"
    GOBIN="$dir/bin.tmp" go install -trimpath -ldflags "-s -w" "$spec"
    mv -f "$dir/bin.tmp/$name" "$dir/$name" && rmdir "$dir/bin.tmp"
    log "built $dir/$name in $((SECONDS - started))s"
  fi
  echo "$dir/$name"
}

[[ $# -gt 0 ]] || die "usage: hack/build-registry-tools.sh crane|registry ..."
for name in "$@"; do
  case $name in
    crane) build crane "github.com/google/go-containerregistry/cmd/crane@$CRANE_VERSION" ;;
    registry) build registry "github.com/distribution/distribution/v3/cmd/registry@$REGISTRY_VERSION" ;;
    *) die "unknown tool $name: crane or registry" ;;
  esac
done
