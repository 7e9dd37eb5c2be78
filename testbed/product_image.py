"""The product's OCI image that ``hack/image/build.sh`` builds with no Docker engine.

The script prints the path of an oci-archive last; its index names the image
(``localhost/composable-dra:<version>-<key>``), the name ``ctr images import`` gives it.
"""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).resolve().parents[1] / "hack" / "image" / "build.sh"
# Set to an archive to use it as is (the script is not run).
ENV_VAR = "COMPOSABLE_DRA_IMAGE"
_REF_NAME = "org.opencontainers.image.ref.name"


class ProductImageError(RuntimeError):
    pass


def _blob_name(descriptor: dict[str, Any]) -> str:
    algorithm, _, digest = str(descriptor["digest"]).partition(":")
    return f"blobs/{algorithm}/{digest}"


def _read_json(tar: tarfile.TarFile, name: str) -> dict[str, Any]:
    member = tar.extractfile(name)
    if member is None:
        raise ProductImageError(f"{name} in the archive is not a file")
    loaded: dict[str, Any] = json.load(member)
    return loaded


def image_ref(index: dict[str, Any]) -> str:
    """The one image an oci-archive's index names (the script writes exactly one)."""
    manifests = index.get("manifests", [])
    if len(manifests) != 1:
        raise ProductImageError(f"expected one image in the archive, found {len(manifests)}")
    ref = manifests[0].get("annotations", {}).get(_REF_NAME)
    if not ref:
        raise ProductImageError(f"the archive's image has no {_REF_NAME} annotation")
    return str(ref)


@dataclass(frozen=True)
class ProductImage:
    archive: Path
    ref: str

    @property
    def tag(self) -> str:
        return self.ref.rpartition(":")[2]

    def config(self) -> dict[str, Any]:
        """The image's OCI config (``config``: User, Entrypoint, Cmd, Env, Labels...)."""
        with tarfile.open(self.archive) as tar:
            index = _read_json(tar, "index.json")
            manifest = _read_json(tar, _blob_name(index["manifests"][0]))
            return _read_json(tar, _blob_name(manifest["config"]))


def find_product_image(archive: str | os.PathLike[str] | None = None) -> ProductImage:
    """The image at ``archive`` or $COMPOSABLE_DRA_IMAGE, or else the one the build script
    builds or reuses (cached by the product's content)."""
    if archive is None:
        archive = os.environ.get(ENV_VAR)
    if archive is None:
        out = subprocess.run(["bash", str(SCRIPT)], stdout=subprocess.PIPE, text=True, check=False)
        if out.returncode != 0:
            raise ProductImageError(f"{SCRIPT} failed (exit {out.returncode}); see its output")
        archive = out.stdout.strip().splitlines()[-1]
    path = Path(archive)
    try:
        with tarfile.open(path) as tar:
            return ProductImage(path, image_ref(_read_json(tar, "index.json")))
    except (OSError, KeyError, tarfile.TarError, json.JSONDecodeError) as exc:
        raise ProductImageError(f"{path} is not an oci-archive: {exc}") from exc
