"""testbed/product_image.py: reading the oci-archive that hack/image/build.sh
writes (its name and config), and a clear error for anything else."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest

from testbed.product_image import ProductImageError, find_product_image, image_ref

REF = "localhost/composable-dra:0.1.0-abc"


def _blob(tar: tarfile.TarFile, body: dict[str, Any]) -> dict[str, Any]:
    data = json.dumps(body).encode()
    digest = hashlib.sha256(data).hexdigest()
    _add(tar, f"blobs/sha256/{digest}", data)
    return {"digest": f"sha256:{digest}", "size": len(data)}


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def archive(path: Path, annotations: dict[str, str]) -> Path:
    with tarfile.open(path, "w") as tar:
        config = _blob(tar, {"config": {"User": "10001:10001"}})
        manifest = _blob(tar, {"schemaVersion": 2, "config": config, "layers": []})
        index = {"schemaVersion": 2, "manifests": [{**manifest, "annotations": annotations}]}
        _add(tar, "index.json", json.dumps(index).encode())
    return path


def test_reads_the_name_tag_and_config(tmp_path: Path) -> None:
    image = find_product_image(
        archive(tmp_path / "i.tar", {"org.opencontainers.image.ref.name": REF})
    )
    assert (image.ref, image.tag) == (REF, "0.1.0-abc")
    assert image.config()["config"]["User"] == "10001:10001"


@pytest.mark.parametrize(
    "index",
    [{"manifests": []}, {"manifests": [{}, {}]}, {"manifests": [{"annotations": {}}]}, {}],
)
def test_an_index_without_one_named_image_is_refused(index: dict[str, Any]) -> None:
    with pytest.raises(ProductImageError):
        image_ref(index)


def test_a_file_that_is_not_an_oci_archive_is_refused(tmp_path: Path) -> None:
    (tmp_path / "not.tar").write_bytes(b"not a tar")
    with pytest.raises(ProductImageError, match="not an oci-archive"):
        find_product_image(tmp_path / "not.tar")
    with tarfile.open(tmp_path / "empty.tar", "w"):
        pass
    with pytest.raises(ProductImageError, match="not an oci-archive"):
        find_product_image(tmp_path / "empty.tar")
