"""A tiny container image built from this machine's own binaries, with no registry.

The rootfs holds ``sh``, ``env``, ``cat`` and ``sleep`` with the shared libraries ``ldd``
names for them; it is written as a docker-archive tarball (``manifest.json`` + config +
one layer), which ``ctr images import`` names from ``RepoTags``. Its default command
waits for SIGTERM, so the same image serves as the pod sandbox ("pause") image.
"""

from __future__ import annotations

import hashlib
import io
import json
import platform
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

IMAGE = "localhost/composable-dra/node-test:1"
TOOLS = ("sh", "env", "cat", "sleep")
# pid 1 of a sandbox: exits on SIGTERM, sleeps otherwise (sh ignores signals while a
# foreground child runs, so the sleep runs in the background and sh waits on it).
PAUSE = ["/bin/sh", "-c", "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done"]

_LDD_PATH = re.compile(r"(/\S+)")
_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}


class TestImageError(RuntimeError):
    pass


def _libraries(binary: Path) -> list[Path]:
    """The shared objects ``binary`` loads, as ``ldd`` resolves them (none for static ones)."""
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        return []  # "not a dynamic executable"
    libs = []
    for line in out.stdout.splitlines():
        match = _LDD_PATH.search(line.split("=>")[-1])
        if match:
            libs.append(Path(match.group(1)))
    return libs


def _add_file(tar: tarfile.TarFile, source: Path, target: str) -> None:
    """Add ``source`` (symlinks followed) as ``target``, owned by root."""
    data = source.read_bytes()
    info = tarfile.TarInfo(target.lstrip("/"))
    info.size = len(data)
    info.mode = source.stat().st_mode & 0o7777
    tar.addfile(info, io.BytesIO(data))


def _add_dir(tar: tarfile.TarFile, name: str) -> None:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    info.mode = 0o1777 if name == "tmp" else 0o755
    tar.addfile(info)


def _layer() -> bytes:
    buf = io.BytesIO()
    files: dict[str, Path] = {}
    for tool in TOOLS:
        found = shutil.which(tool)
        if found is None:
            raise TestImageError(f"{tool!r} is not on PATH; the test image needs it")
        binary = Path(found).resolve()
        files[f"/bin/{tool}"] = binary
        for lib in _libraries(binary):
            # The loader path is baked into the binary: keep each library's own path.
            files[str(lib)] = lib.resolve()
    dirs = {"bin", "tmp", "proc", "sys", "dev", "etc"}
    for target in files:
        parts = Path(target).parts[1:-1]
        dirs.update("/".join(parts[: i + 1]) for i in range(len(parts)))
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in sorted(dirs):
            _add_dir(tar, d)
        for target, source in sorted(files.items()):
            _add_file(tar, source, target)
    return buf.getvalue()


def build(path: Path, name: str = IMAGE) -> Path:
    """Write the image as a docker-archive tarball at ``path``."""
    layer = _layer()
    layer_digest = hashlib.sha256(layer).hexdigest()
    config = json.dumps(
        {
            "architecture": _ARCH.get(platform.machine(), platform.machine()),
            "os": "linux",
            "config": {"Cmd": PAUSE, "Env": ["PATH=/bin"], "WorkingDir": "/"},
            "rootfs": {"type": "layers", "diff_ids": [f"sha256:{layer_digest}"]},
        }
    ).encode()
    config_name = f"{hashlib.sha256(config).hexdigest()}.json"
    manifest = json.dumps(
        [{"Config": config_name, "RepoTags": [name], "Layers": [f"{layer_digest}/layer.tar"]}]
    ).encode()
    with tarfile.open(path, mode="w") as tar:
        for member, data in (
            (f"{layer_digest}/layer.tar", layer),
            (config_name, config),
            ("manifest.json", manifest),
        ):
            info = tarfile.TarInfo(member)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return path
