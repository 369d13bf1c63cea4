#!/usr/bin/env bash
# Build the parts of a real Kubernetes node for the real-node tier (tests/realnode): the kubelet of
# each release, containerd with its runc shim and ctr, and crictl, from the Go module proxy with the
# ordinary `go` client; runc, the CNI plugins and a static busybox come from Debian's packages.
#
#   hack/build-node.sh [VERSION ...]      (default: the kubelets the tier runs, below)
#
# The tier runs the oldest supported release's kubelet beside its own control plane, and the newest
# kubelet that builds here beside the newest control plane: 1.38.0-beta.0's kubelet imports
# sigs.k8s.io/iptables-wrappers, which the module proxy does not serve, so 1.37.2's kubelet joins the
# 1.38 control plane (one minor older, as during an upgrade, which Kubernetes' skew policy allows).
#
# Per Kubernetes version it builds that release's control plane, kubelet, kube-proxy and kubectl with
# hack/build-control-plane.sh --node (same cache, same version stamp). Once per machine it leaves
# in ${XDG_CACHE_HOME:-$HOME/.cache}/dra-gateway/kube/:
#   _containerd-<v>/{containerd,containerd-shim-runc-v2,ctr}   github.com/containerd/containerd/v2
#   _crictl-<v>/crictl                                         sigs.k8s.io/cri-tools
# What exists is kept: a second run builds nothing. Missing Debian packages are installed with
# apt-get when this runs as root; otherwise the script names them and fails. Progress goes to
# standard error; standard output gets one line per version: the folder holding its binaries.
set -euo pipefail

VERSIONS_DEFAULT=(1.34.4 1.37.2)
# containerd 2.x reads CDI specs (`enable_cdi`); Debian's 1.6 does not.
CONTAINERD_VERSION=${CONTAINERD_VERSION:-v2.2.10}
CRICTL_VERSION=${CRICTL_VERSION:-v1.34.0}
# Debian package -> a file it installs, to tell whether it is here.
DEBIAN_PACKAGES=(
  "runc:/usr/sbin/runc"
  "containernetworking-plugins:/usr/lib/cni/bridge"
  "busybox-static:/bin/busybox"
  "iproute2:/usr/sbin/ip"
  "util-linux:/usr/bin/nsenter"
  "iptables:/usr/sbin/iptables"
)
CACHE=${DRA_GATEWAY_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dra-gateway/kube}
HERE=$(cd "$(dirname "$0")" && pwd)
export GOTOOLCHAIN=local GOFLAGS=-buildvcs=false CGO_ENABLED=0

log() { printf 'build-node: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

command -v go >/dev/null || die "go not found on PATH (Go 1.26 or newer builds containerd and crictl)"

# go install each `package@version` of $2.. into folder $1 unless all its binaries are there.
install_into() {
  local dir=$1; shift
  local missing=0 spec
  for spec in "$@"; do
    local name=${spec%@*}; name=${name##*/}
    [[ -x $dir/$name ]] || missing=1
  done
  [[ $missing == 0 ]] && { log "have $dir"; return; }
  local started=$SECONDS
  log "building $dir"
  mkdir -p "$dir"
  GOBIN="$dir/bin.tmp" go install -trimpath -ldflags "-s -w" "$@"
  mv -f "$dir"/bin.tmp/* "$dir"/ && rmdir "$dir/bin.tmp"
  log "built $dir in $((SECONDS - started))s"
}

debian_packages() {
  local wanted=() entry
  for entry in "${DEBIAN_PACKAGES[@]}"; do
    [[ -e ${entry#*:} ]] || wanted+=("${entry%%:*}")
  done
  [[ ${#wanted[@]} == 0 ]] && return
  if [[ $(id -u) != 0 ]] || ! command -v apt-get >/dev/null; then
    die "missing Debian packages: ${wanted[*]} (install them as root: apt-get install ${wanted[*]})"
  fi
  log "installing Debian packages: ${wanted[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${wanted[@]}" >&2 ||
    { apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -q --no-install-recommends "${wanted[@]}" >&2; } ||
    die "apt-get could not install ${wanted[*]}"
}

versions=("$@")
[[ ${#versions[@]} -gt 0 ]] || versions=("${VERSIONS_DEFAULT[@]}")
# Two runs at once (the tests' and .ci/run's background builds) take turns over what every node
# shares; each release's binaries have their own lock in build-control-plane.sh.
mkdir -p "$CACHE"
exec 9>"$CACHE/_node-tools.lock"
flock -n 9 || { log "waiting for another build of the node's tools"; flock 9; }
debian_packages
install_into "$CACHE/_containerd-$CONTAINERD_VERSION" \
  "github.com/containerd/containerd/v2/cmd/containerd@$CONTAINERD_VERSION" \
  "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION" \
  "github.com/containerd/containerd/v2/cmd/ctr@$CONTAINERD_VERSION"
install_into "$CACHE/_crictl-$CRICTL_VERSION" "sigs.k8s.io/cri-tools/cmd/crictl@$CRICTL_VERSION"
exec 9>&-
for version in "${versions[@]}"; do
  dir=$(bash "$HERE/build-control-plane.sh" --node "$version" | tail -n1)
  ln -sfn "$CACHE/_containerd-$CONTAINERD_VERSION" "$dir/containerd"
  ln -sfn "$CACHE/_crictl-$CRICTL_VERSION" "$dir/crictl"
  echo "$dir"
done
