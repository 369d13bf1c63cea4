#!/usr/bin/env bash
# Package the chart and push it to an OCI registry, from where `helm install` takes it without a
# checkout of this repository:
#
#   hack/publish-chart.sh oci://REGISTRY/PATH
#
# `helm package` writes dist/dra-gateway-<version>.tgz (DIST=FOLDER elsewhere), `helm push` puts
# it at oci://REGISTRY/PATH/dra-gateway:<version>. helm is DRA_GATEWAY_HELM, else helm on PATH
# (v3.8 or newer); it logs in with `helm registry login REGISTRY`. A registry served over plain
# HTTP needs PUBLISH_INSECURE=1 (helm's --plain-http; loopback gets it without).
# Progress goes to standard error; standard output gets the package's path, the chart's
# reference and digest, then the install line.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
HELM=${DRA_GATEWAY_HELM:-$(command -v helm || true)}
DIST=${DIST:-$ROOT/dist}

log() { printf 'publish-chart: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

[[ $# == 1 && $1 == oci://*/* ]] || die "usage: hack/publish-chart.sh oci://REGISTRY/PATH"
[[ -n $HELM && -x $HELM ]] || die "helm not found: set DRA_GATEWAY_HELM or put helm v3.8+ on PATH"
target=${1%/}
host=${target#oci://}; host=${host%%/*}

flags=()
if [[ ${PUBLISH_INSECURE:-} == 1 || $host == localhost:* || $host == 127.* || $host == "[::1]"* ]]; then
  flags+=(--plain-http)
fi

mkdir -p "$DIST"
"$HELM" lint --strict --kube-version 1.34.0 "$ROOT/helm/dra-gateway" >&2 || die "helm lint failed: fix the chart first"
packaged=$("$HELM" package "$ROOT/helm/dra-gateway" --destination "$DIST")
package=${packaged##*: }
[[ -f $package ]] || die "helm package wrote no package: $packaged"
log "packaged $package"

output=$("$HELM" push "$package" "$target" "${flags[@]}" 2>&1) || die "helm push failed: $output"
pushed=$(sed -n 's/^Pushed: *//p' <<<"$output")
digest=$(sed -n 's/^Digest: *//p' <<<"$output")
[[ -n $pushed && -n $digest ]] || die "helm push printed no reference and digest: $output"
version=${pushed##*:}
log "pushed $pushed ($digest)"

echo "$package"
echo "$pushed@$digest"
echo "helm install dra-gateway $target/dra-gateway --version $version${flags:+ ${flags[*]}} -n dra-gateway --create-namespace --set image.repository=REGISTRY/REPOSITORY"
