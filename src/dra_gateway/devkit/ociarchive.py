"""OCI image archives written without a container engine, for machines with no registry.

`write_archive` lays out an OCI image (an `oci-layout`, an `index.json`, a manifest, a config and
uncompressed tar layers under `blobs/sha256/`) in one tar file that `ctr images import` (containerd)
and `skopeo copy oci-archive:` read; the index names the image for containerd
(`io.containerd.image.name`) and for OCI tools (`org.opencontainers.image.ref.name`).
`busybox_layer` is the layer of a small test image: a static busybox with its applets as links.

Layers are uncompressed (`application/vnd.oci.image.layer.v1.tar`), so a layer's digest is also its
diff ID; large layers are hashed as they are copied, never read into memory whole.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

INDEX_TYPE = "application/vnd.oci.image.index.v1+json"
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar"
_CHUNK = 1 << 20


def _digest_of(path: Path) -> tuple[str, int]:
    sha = hashlib.sha256()
    size = 0
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            sha.update(chunk)
            size += len(chunk)
    return f"sha256:{sha.hexdigest()}", size


def _add_bytes(archive: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    archive.addfile(info, io.BytesIO(data))


def _blob(archive: tarfile.TarFile, data: bytes) -> tuple[str, int]:
    digest = f"sha256:{hashlib.sha256(data).hexdigest()}"
    _add_bytes(archive, f"blobs/sha256/{digest.removeprefix('sha256:')}", data)
    return digest, len(data)


def _canonical(document: Mapping[str, Any]) -> bytes:
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


def write_archive(out: Path, name: str, layers: Sequence[Path], config: Mapping[str, Any], *,
                  architecture: str = "amd64") -> str:
    """Write the image `name` (`registry/repository:tag`) made of uncompressed tar `layers`
    (lowest first) and the runtime `config` (Env, Entrypoint, Cmd, WorkingDir, User, Labels) to
    the OCI archive `out`; its manifest's digest."""
    repository, _, tag = name.rpartition(":")
    if not repository or "/" in tag:
        raise ValueError(f"image name {name!r} has no tag: give it as registry/repository:tag")
    layer_blobs = [(path, *_digest_of(path)) for path in layers]
    image_config = {
        "architecture": architecture, "os": "linux", "config": dict(config),
        "rootfs": {"type": "layers", "diff_ids": [digest for _, digest, _ in layer_blobs]},
    }
    partial = out.with_name(out.name + ".partial")
    with tarfile.open(partial, "w") as archive:
        _add_bytes(archive, "oci-layout", _canonical({"imageLayoutVersion": "1.0.0"}))
        for path, digest, _ in layer_blobs:
            archive.add(path, arcname=f"blobs/sha256/{digest.removeprefix('sha256:')}",
                        recursive=False)
        config_digest, config_size = _blob(archive, _canonical(image_config))
        manifest = {
            "schemaVersion": 2, "mediaType": MANIFEST_TYPE,
            "config": {"mediaType": CONFIG_TYPE, "digest": config_digest, "size": config_size},
            "layers": [{"mediaType": LAYER_TYPE, "digest": digest, "size": size}
                       for _, digest, size in layer_blobs],
        }
        manifest_digest, manifest_size = _blob(archive, _canonical(manifest))
        _add_bytes(archive, "index.json", _canonical({
            "schemaVersion": 2, "mediaType": INDEX_TYPE,
            "manifests": [{"mediaType": MANIFEST_TYPE, "digest": manifest_digest,
                           "size": manifest_size,
                           "platform": {"architecture": architecture, "os": "linux"},
                           "annotations": {"io.containerd.image.name": name,
                                           "org.opencontainers.image.ref.name": tag}}]}))
    partial.replace(out)
    return manifest_digest


def busybox_layer(out: Path, busybox: Path = Path("/bin/busybox")) -> Path:
    """A layer holding a static `busybox` at /bin/busybox, a link per applet in /bin, and the
    empty folders a container's mounts land on; written to `out`."""
    if not busybox.is_file():
        raise FileNotFoundError(f"{busybox} not found: install Debian's busybox-static")
    listed = subprocess.run([str(busybox), "--list"], capture_output=True, text=True,
                            check=True, timeout=10).stdout.split()
    with tarfile.open(out, "w") as archive:
        for folder in ("bin", "dev", "etc", "proc", "sys", "tmp", "var", "run"):
            info = tarfile.TarInfo(folder)
            info.type = tarfile.DIRTYPE
            info.mode = 0o1777 if folder == "tmp" else 0o755
            archive.addfile(info)
        archive.add(busybox, arcname="bin/busybox", recursive=False)
        for applet in sorted(set(listed) - {"busybox"}):
            info = tarfile.TarInfo(f"bin/{applet}")
            info.type = tarfile.SYMTYPE
            info.linkname = "busybox"
            info.mode = 0o777
            archive.addfile(info)
        for name, text in (("etc/passwd", "root:x:0:0:root:/:/bin/sh\n"),
                           ("etc/group", "root:x:0:\n")):
            _add_bytes(archive, name, text.encode())
    return out


def busybox_image(out: Path, name: str, *, busybox: Path = Path("/bin/busybox")) -> str:
    """The OCI archive of a busybox image whose default command sleeps until stopped (so it
    can also serve as a pod sandbox's pause image); its manifest digest."""
    folder = Path(tempfile.mkdtemp(prefix="busybox-layer-"))
    try:
        layer = busybox_layer(folder / "layer.tar", busybox)
        return write_archive(out, name, [layer], {
            "Env": ["PATH=/bin"], "Cmd": ["/bin/busybox", "sleep", "2147483647"]})
    finally:
        shutil.rmtree(folder, ignore_errors=True)
