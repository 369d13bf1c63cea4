#!/usr/bin/env bash
# Publish the gateway's image to a registry the nodes can pull from, without a container engine:
# the OCI archive hack/build-image.sh writes is pushed with go-containerregistry's crane.
#
#   hack/publish-image.sh REGISTRY/REPOSITORY[:TAG] [ARCHIVE]
#
#   REGISTRY/REPOSITORY[:TAG]   where to push, e.g. registry.example.com/gpu/dra-gateway; TAG
#                               defaults to the chart's appVersion (what the chart pulls when
#                               image.tag is empty)
#   ARCHIVE                     the OCI archive (default: dist/dra-gateway-image.oci.tar); when
#                               it is missing and this runs as root, hack/build-image.sh builds it
#
# crane is built once, pinned, by hack/build-registry-tools.sh (CRANE=PATH uses another). It logs
# in with the Docker config (`crane auth login REGISTRY -u USER --password-stdin`, or
# `docker login`); a registry served over plain HTTP needs PUBLISH_INSECURE=1 (loopback is
# plain HTTP without it). Progress goes to standard error; standard output gets the pushed
# reference with its digest, then the `helm install` values that run it.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)

log() { printf 'publish-image: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

[[ $# -ge 1 && $# -le 2 && $1 != -* ]] ||
  die "usage: hack/publish-image.sh REGISTRY/REPOSITORY[:TAG] [ARCHIVE]"
target=$1
ARCHIVE=${2:-$ROOT/dist/dra-gateway-image.oci.tar}

# REPOSITORY[:TAG]: a colon after the last slash is the tag's (a port's colon comes before it).
last=${target##*/}
if [[ $target == *@* ]]; then
  die "$target: name a tag, not a digest (the digest is what the push prints)"
elif [[ $last == *:* ]]; then
  repository=${target%:*}
  tag=${last##*:}
else
  repository=$target
  tag=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\} *$/\1/p' "$ROOT/helm/dra-gateway/Chart.yaml")
  [[ -n $tag ]] || die "no appVersion in helm/dra-gateway/Chart.yaml: name the tag"
fi
[[ $repository == */* ]] ||
  die "$target: name the registry too (REGISTRY/REPOSITORY[:TAG]), or the nodes would pull from Docker Hub"

if [[ ! -f $ARCHIVE ]]; then
  [[ $(id -u) == 0 && $# == 1 ]] ||
    die "$ARCHIVE not found: build it first with \`sudo hack/build-image.sh\`"
  log "$ARCHIVE not found: building it (hack/build-image.sh)"
  bash "$ROOT/hack/build-image.sh" "$ARCHIVE" >&2
fi

CRANE=${CRANE:-$(bash "$ROOT/hack/build-registry-tools.sh" crane)}
flags=()
[[ ${PUBLISH_INSECURE:-} == 1 ]] && flags+=(--insecure)

# crane pushes an OCI image layout from a folder (a file it would read as a Docker archive).
work=$(mktemp -d -t dra-gateway-publish.XXXXXX)
trap 'rm -rf "$work"' EXIT
tar -xf "$ARCHIVE" -C "$work"
[[ -f $work/index.json && -f $work/oci-layout ]] ||
  die "$ARCHIVE is not an OCI image archive (no index.json or oci-layout): hack/build-image.sh writes one"

log "pushing $ARCHIVE to $repository:$tag"
pushed=$("$CRANE" push "${flags[@]}" "$work" "$repository:$tag")
digest=${pushed##*@}
[[ $digest == sha256:* ]] || die "crane push printed no digest: $pushed"
log "pushed $repository:$tag ($digest)"

echo "$repository@$digest"
echo "--set image.repository=$repository --set image.tag=$tag"
echo "# or pinned to what was pushed: --set image.repository=$repository --set image.tag=$tag@$digest"
