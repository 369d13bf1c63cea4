#!/usr/bin/env bash
# Build the gateway's image without a container engine, as an OCI archive that containerd imports
# (`ctr -n k8s.io images import`) on machines without a registry:
#
#   sudo hack/build-image.sh [OUT.tar] [NAME]    (default: dist/dra-gateway-image.oci.tar,
#                                                 dra-gateway.local/dra-gateway:<version>)
#
# It follows the Dockerfile's steps: the project's wheels (the production build, without the
# development kit: setup.py) and its dependencies' built with `pip wheel --constraint
# constraints.txt`, installed offline (`--no-index`) into a root file
# system of Debian bookworm with its Python 3.11 (mmdebstrap, from Debian's packages), a system
# user 65532 for the components, entrypoint `dra-gateway`. Instead of the Dockerfile's python:3.11-slim
# base (from a registry), the base is Debian's own Python 3.11, and the project goes into a virtual
# environment at /opt/dra-gateway (Debian's system Python refuses pip installs into /usr).
# The root file system is one uncompressed layer (dra_gateway.devkit.ociarchive writes the
# archive). Needs root (mmdebstrap and chroot) and about 300 MB of disk; about a minute.
# Progress goes to standard error; standard output gets the archive's path and the image's name.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
VERSION=$("$PYTHON" -c 'import importlib.metadata as m; print(m.version("dra-gateway"))')
OUT=${1:-$ROOT/dist/dra-gateway-image.oci.tar}
NAME=${2:-dra-gateway.local/dra-gateway:$VERSION}
SUITE=${DEBIAN_SUITE:-bookworm}

log() { printf 'build-image: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

[[ $(id -u) == 0 ]] || die "run as root: mmdebstrap and chroot build the root file system"
command -v mmdebstrap >/dev/null || {
  command -v apt-get >/dev/null || die "mmdebstrap not found (Debian's package mmdebstrap)"
  log "installing Debian's mmdebstrap"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends mmdebstrap >&2 ||
    { apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -q --no-install-recommends mmdebstrap >&2; } ||
    die "apt-get could not install mmdebstrap"
}

work=$(mktemp -d "${TMPDIR:-/tmp}/dra-gateway-image.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/wheels" "$work/rootfs" "$(dirname "$OUT")"

started=$SECONDS
log "building the wheelhouse (constraints.txt), the development kit left out"
# From a copy of the tree's files (tracked, and new ones git does not ignore): a build folder
# left in the checkout by an earlier install would bring its files (the devkit's) along.
mkdir -p "$work/src"
(cd "$ROOT" && git ls-files -z --cached --others --exclude-standard |
  xargs -0 cp --parents --no-dereference -t "$work/src")
DRA_GATEWAY_PRODUCTION=1 "$PYTHON" -m pip wheel -q --constraint "$ROOT/constraints.txt" \
  --wheel-dir "$work/wheels" "$work/src" >&2

log "making a $SUITE root file system with Python 3.11 (mmdebstrap)"
mmdebstrap --quiet --variant=apt --include=python3,python3-venv,ca-certificates \
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' \
  "$SUITE" "$work/rootfs" >&2

log "installing the project offline into /opt/dra-gateway"
cp -r "$work/wheels" "$work/rootfs/wheels"
cp "$ROOT/constraints.txt" "$work/rootfs/wheels/"
# A clean environment: nothing of this machine's pip settings reaches the image's pip.
in_root() { chroot "$work/rootfs" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root "$@"; }
in_root python3 -m venv /opt/dra-gateway
in_root PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 /opt/dra-gateway/bin/pip install -q --no-index --find-links /wheels \
  --constraint /wheels/constraints.txt dra-gateway >&2
rm -rf "$work/rootfs/wheels" "$work/rootfs/var/cache/apt/archives/"*.deb \
  "$work/rootfs/var/lib/apt/lists/"*
in_root groupadd --system --gid 65532 dra-gateway
# (useradd warns that 65532 is above the system range: the number is the point.)
in_root useradd --system --uid 65532 --gid 65532 --no-create-home \
  --home-dir /nonexistent --shell /usr/sbin/nologin dra-gateway
# What the Dockerfile's python:3.11-slim base leaves empty.
: >"$work/rootfs/etc/machine-id"

log "writing the OCI archive"
tar --numeric-owner --xattrs -C "$work/rootfs" -cf "$work/layer.tar" .
"$PYTHON" - "$OUT" "$NAME" "$work/layer.tar" <<'EOF'
import sys
from pathlib import Path

from dra_gateway.devkit.ociarchive import write_archive

out, name, layer = sys.argv[1], sys.argv[2], sys.argv[3]
digest = write_archive(Path(out), name, [Path(layer)], {
    "Env": ["PATH=/opt/dra-gateway/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1"],
    # Numeric, so that runAsNonRoot can verify it without resolving a name; the node plugin's
    # pod overrides it with root (it writes into the kubelet's folders).
    "User": "65532:65532",
    "Entrypoint": ["dra-gateway"], "Cmd": ["--help"],
})
print(f"build-image: {name} {digest}", file=sys.stderr)
EOF
log "built $OUT in $((SECONDS - started))s ($(du -h "$OUT" | cut -f1))"
echo "$OUT $NAME"
