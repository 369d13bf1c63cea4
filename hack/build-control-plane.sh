#!/usr/bin/env bash
# Build a real Kubernetes control plane from the Go module proxy with the ordinary `go` client,
# for the end-to-end tier (tests/e2e) and for anyone who wants to run the gateway on one.
#
#   hack/build-control-plane.sh [--node] [VERSION ...]   (default: the supported releases below)
#
# VERSION is a release (1.37.2) or a pre-release the module proxy serves (1.38.0-beta.0).
# --node also builds that release's kubelet, kube-proxy and kubectl, from the same wrapper module
# and with the same version stamp, for the real-node tier (hack/build-node.sh asks for it).
#
# Per Kubernetes version it leaves in ${XDG_CACHE_HOME:-$HOME/.cache}/dra-gateway/kube/<version>/:
#   kube-apiserver, kube-controller-manager, kube-scheduler   built from k8s.io/kubernetes@v<version>
#   etcd                                                      go.etcd.io/etcd/server/v3 (ETCD_VERSION)
#   kwok, kwok-stages.yaml                                    sigs.k8s.io/kwok (KWOK_VERSION) and the
#                                                             node/pod stages its module ships
# etcd and KWOK are built once (kube/_etcd-<v>, kube/_kwok-<v>) and linked into each version's folder.
# What exists is kept: a second run builds nothing and takes seconds; two runs at once take turns
# per version (a lock file beside each folder). Progress goes to standard
# error; standard output gets one line per version: the folder holding its binaries.
#
# k8s.io/kubernetes cannot be `go install`ed (it requires its staging modules at v0.0.0 and replaces
# them with folders of its own repository), so each version gets a small wrapper module whose
# replace list is generated from that tag's own go.mod: every `=> ./staging/src/k8s.io/X` becomes
# `k8s.io/X => k8s.io/X v0.<minor>.<patch>`. The binaries carry the version stamp upstream's build
# gives them (otherwise /version says v0.0.0).
set -euo pipefail

VERSIONS_DEFAULT=(1.34.4 1.35.4 1.36.3 1.37.2)
ETCD_VERSION=${ETCD_VERSION:-v3.6.5}
KWOK_VERSION=${KWOK_VERSION:-v0.8.0}
CACHE=${DRA_GATEWAY_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dra-gateway/kube}

# The Go toolchain: this machine's own, except for a release whose go.mod asks for a newer
# language version (1.38 asks for Go 1.27): that release alone is built with NEWER_GO, which the
# go command takes from the Go module proxy like any module (about 10 s, once per machine). This is
# the one place the project names it; nothing else (docs/development.md, .ci/run) needs to export GOTOOLCHAIN.
NEWER_GO=${DRA_GATEWAY_NEWER_GO:-go1.27.3}
# Everything else builds with the local Go, which fails with its own message instead of fetching.
export GOTOOLCHAIN=local GOFLAGS=-buildvcs=false CGO_ENABLED=0

log() { printf 'build-control-plane: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

command -v go >/dev/null || die "go not found on PATH (Go 1.26 or newer builds every supported release)"
command -v flock >/dev/null || die "flock not found on PATH (util-linux)"

# Build `package` of the module in folder $1 into $2 unless it is there; $3.. go build arguments.
build_into() {
  local dir=$1 out=$2; shift 2
  if [[ -x $out ]]; then log "have $out"; return; fi
  local started=$SECONDS
  log "building $out"
  (cd "$dir" && go build -trimpath -o "$out.tmp" "$@")
  mv -f "$out.tmp" "$out"
  log "built $out in $((SECONDS - started))s"
}

# Hard link (or copy, across file systems) $1 to $2 unless $2 exists.
place() {
  [[ -e $2 ]] || ln -f "$1" "$2" 2>/dev/null || cp -f "$1" "$2"
}

# Hold an exclusive lock on $CACHE/$1.lock on file descriptor 9 until the calling function
# returns: two builds of one thing (the tests' and .ci/run's background builds) take turns, and
# the second finds the first's binaries.
lock() {
  exec 9>"$CACHE/$1.lock"
  if ! flock -n 9; then
    log "waiting for another build of $1"
    flock 9
  fi
}
unlock() { exec 9>&-; }

build_etcd() {
  local dir=$CACHE/_etcd-$ETCD_VERSION
  [[ -x $dir/etcd ]] && return
  lock "_etcd-$ETCD_VERSION"
  mkdir -p "$dir/src"
  if [[ ! -f $dir/src/go.sum ]]; then
    cat >"$dir/src/go.mod" <<EOF
module dra-gateway.local/etcd

go 1.24.0

require go.etcd.io/etcd/server/v3 $ETCD_VERSION
EOF
    cat >"$dir/src/tools.go" <<'EOF'
//go:build tools

package tools

import _ "go.etcd.io/etcd/server/v3"
EOF
    (cd "$dir/src" && go mod tidy) >&2
  fi
  build_into "$dir/src" "$dir/etcd" -ldflags "-s -w" go.etcd.io/etcd/server/v3
  unlock
}

build_kwok() {
  local dir=$CACHE/_kwok-$KWOK_VERSION
  [[ -x $dir/kwok && -f $dir/kwok-stages.yaml ]] && return
  lock "_kwok-$KWOK_VERSION"
  mkdir -p "$dir"
  if [[ ! -x $dir/kwok ]]; then
    local started=$SECONDS
    log "building $dir/kwok"
    GOBIN="$dir/bin.tmp" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
    mv -f "$dir/bin.tmp/kwok" "$dir/kwok" && rmdir "$dir/bin.tmp"
    log "built $dir/kwok in $((SECONDS - started))s"
  fi
  # KWOK exits with "no stages found" without Stage objects; its module ships them.
  local source
  source=$(go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
  [[ -d $source/kustomize/stage ]] || die "no kustomize/stage in sigs.k8s.io/kwok@$KWOK_VERSION ($source)"
  local stage=$source/kustomize/stage
  {
    for file in node/fast/node-initialize.yaml pod/fast/pod-ready.yaml \
                pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
      [[ -f $stage/$file ]] || die "sigs.k8s.io/kwok@$KWOK_VERSION has no kustomize/stage/$file"
      printf -- '---\n'
      cat "$stage/$file"
    done
  } >"$dir/kwok-stages.yaml.tmp"
  mv -f "$dir/kwok-stages.yaml.tmp" "$dir/kwok-stages.yaml"
  unlock
}

# The toolchain for a module whose go.mod is $1: "local" while this machine's Go is new enough.
toolchain_for() {
  local wanted local_version
  wanted=$(sed -n 's/^go \([0-9][0-9.]*\)$/\1/p' "$1")
  local_version=$(GOTOOLCHAIN=local go env GOVERSION)
  local_version=${local_version#go}
  if [[ -z $wanted ]] || [[ $(printf '%s\n%s\n' "$wanted" "$local_version" | sort -V | tail -n1) == "$local_version" ]]; then
    echo local
  else
    log "$1 asks for Go $wanted; this machine has $local_version: building with $NEWER_GO"
    echo "$NEWER_GO"
  fi
}

build_kube() {
  local version=${1#v}
  [[ $version =~ ^1\.([0-9]+)\.([0-9]+)(-(alpha|beta|rc)\.[0-9]+)?$ ]] ||
    die "not a Kubernetes release: $1 (give e.g. 1.37.2 or 1.38.0-beta.0)"
  local minor=${BASH_REMATCH[1]} patch=${BASH_REMATCH[2]} pre=${BASH_REMATCH[3]}
  local dir=$CACHE/$version src=$CACHE/$version/src
  lock "$version"
  mkdir -p "$src"
  if [[ ! -f $src/go.sum ]]; then
    local upstream
    # Its go.mod alone: the module's source may need a newer Go than this one (toolchain_for).
    upstream=$(go mod download -json "k8s.io/kubernetes@v$version" 2>/dev/null |
      sed -n 's/^\t"GoMod": "\(.*\)",$/\1/p' || true)
    [[ -f $upstream ]] || die "the module proxy gave no go.mod for k8s.io/kubernetes@v$version"
    {
      echo "module dra-gateway.local/kube"
      echo
      # The tag's own language version and godebug defaults, so the binaries behave as upstream's.
      grep -E '^go [0-9]' "$upstream"
      grep -E '^godebug ' "$upstream" || true
      echo
      echo "require k8s.io/kubernetes v$version"
      echo
      echo "replace ("
      sed -n 's|^[[:space:]]*\(k8s\.io/[^[:space:]]*\) => \./staging/.*$|\1|p' "$upstream" |
        while read -r module; do echo "	$module => $module v0.$minor.$patch$pre"; done
      echo ")"
    } >"$src/go.mod"
    grep -q ' => ' "$src/go.mod" || die "no staging replacements found in k8s.io/kubernetes@v$version's go.mod"
    cat >"$src/tools.go" <<'EOF'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver/app"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	_ "k8s.io/kubernetes/cmd/kube-scheduler/app"
)
EOF
    log "resolving modules of k8s.io/kubernetes@v$version"
    (cd "$src" && GOTOOLCHAIN=$(toolchain_for go.mod) go mod tidy) >&2
  fi
  # The node's packages (kubelet, kube-proxy) and kubectl, only when asked for: the versions
  # stay those of the tag's go.mod and go.sum gains theirs. 1.38.0-beta.0's kubelet imports
  # sigs.k8s.io/iptables-wrappers, which the module proxy does not serve: that tidy fails.
  local node_imports=(k8s.io/kubernetes/cmd/kubelet/app k8s.io/kubernetes/cmd/kube-proxy/app
                      k8s.io/kubectl/pkg/cmd)
  local package missing=()
  if [[ $with_node == 1 ]]; then
    for package in "${node_imports[@]}"; do
      grep -q "\"$package\"" "$src/tools.go" || missing+=("$package")
    done
  fi
  if [[ ${#missing[@]} -gt 0 ]]; then
    cp "$src/tools.go" "$src/tools.go.orig"
    for package in "${missing[@]}"; do
      sed -i "s|^\t_ \"k8s.io/kubernetes/cmd/kube-scheduler/app\"\$|&\n\t_ \"$package\"|" "$src/tools.go"
    done
    log "resolving the modules of ${missing[*]} for k8s.io/kubernetes@v$version"
    if ! (cd "$src" && GOTOOLCHAIN=$(toolchain_for go.mod) go mod tidy) >&2; then
      mv -f "$src/tools.go.orig" "$src/tools.go"
      die "the node of $version (kubelet, kube-proxy, kubectl) cannot be built here: its modules did not resolve (above)"
    fi
    rm -f "$src/tools.go.orig"
  fi
  local toolchain
  toolchain=$(toolchain_for "$src/go.mod")
  local ldflags="-s -w -X k8s.io/component-base/version.gitVersion=v$version"
  ldflags+=" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
  ldflags+=" -X k8s.io/component-base/version.gitTreeState=clean"
  local components=(kube-apiserver kube-controller-manager kube-scheduler)
  [[ $with_node == 1 ]] && components+=(kubelet kube-proxy kubectl)
  for component in "${components[@]}"; do
    GOTOOLCHAIN=$toolchain build_into "$src" "$dir/$component" -tags selinux,notest \
      -ldflags "$ldflags" "k8s.io/kubernetes/cmd/$component"
  done
  place "$CACHE/_etcd-$ETCD_VERSION/etcd" "$dir/etcd"
  place "$CACHE/_kwok-$KWOK_VERSION/kwok" "$dir/kwok"
  cp -f "$CACHE/_kwok-$KWOK_VERSION/kwok-stages.yaml" "$dir/kwok-stages.yaml"
  unlock
}

with_node=0
if [[ ${1:-} == --node ]]; then with_node=1; shift; fi
versions=("$@")
[[ ${#versions[@]} -gt 0 ]] || versions=("${VERSIONS_DEFAULT[@]}")
mkdir -p "$CACHE"
build_etcd
build_kwok
for version in "${versions[@]}"; do
  build_kube "$version"
  echo "$CACHE/${version#v}"
done
