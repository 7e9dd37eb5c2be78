"""The product image that hack/image/build.sh builds without a Docker engine declares what
the Dockerfile declares, runs as uid 10001 under runc, and holds exactly the distributions
the Dockerfile's `pip install` asks for, as `pip freeze` lists them inside the image.

The image is unpacked by umoci into a runtime bundle (its config.json made from the image
config, as a container runtime's is) and run by runc, the runtime the real nodes use.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import tarfile
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dockerfile_parse import DockerfileParser
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from testbed.product_image import ProductImage, find_product_image

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
# `pip freeze` leaves out the installer's own distributions.
FREEZE_HIDES = {"pip", "setuptools", "wheel", "distribute"}


def pyproject_version() -> str:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return str(tomllib.load(f)["project"]["version"])


def dockerfile(**build_args: str) -> DockerfileParser:
    return DockerfileParser(str(ROOT / "Dockerfile"), build_args=build_args)


def final_stage(parsed: DockerfileParser, instruction: str) -> str:
    """The value of the last ``instruction`` of the Dockerfile (its final stage's)."""
    values = [i["value"] for i in parsed.structure if i["instruction"] == instruction]
    assert values, f"the Dockerfile has no {instruction}"
    return str(values[-1])


def installed_requirement(parsed: DockerfileParser) -> Requirement:
    """What the final stage's `pip install` installs: ``composable-dra[extras]``."""
    words = shlex.split(final_stage(parsed, "RUN"))
    (wanted,) = [w for w in words if canonicalize_name(w.split("[")[0]) == "composable-dra"]
    return Requirement(wanted)


def required_closure(
    root: Requirement, installed: dict[str, dict[str, Any]], environment: dict[str, str]
) -> dict[str, str]:
    """Every distribution ``root`` needs, by name, with its installed version: the
    requirements of each, markers evaluated for ``environment`` and the extras asked for.
    A requirement that is missing or whose version does not satisfy it fails the test."""
    needed: dict[str, str] = {}
    pending = [root]
    seen: set[tuple[str, frozenset[str]]] = set()
    while pending:
        req = pending.pop()
        name = canonicalize_name(req.name)
        if (name, frozenset(req.extras)) in seen:
            continue
        seen.add((name, frozenset(req.extras)))
        assert name in installed, f"{req} is required but not installed"
        meta = installed[name]
        assert req.specifier.contains(meta["version"], prereleases=True), (
            f"{name} {meta['version']} does not satisfy {req}"
        )
        needed[name] = meta["version"]
        for text in meta.get("requires_dist", []):
            dep = Requirement(text)
            extras = req.extras or {""}
            if dep.marker is None or any(
                dep.marker.evaluate({**environment, "extra": e}) for e in extras
            ):
                pending.append(dep)
    return needed


class Bundle:
    """The image unpacked by umoci; ``run`` runs its process (or ``args``) under runc."""

    def __init__(self, path: Path, state: Path) -> None:
        self.path = path
        self.state = state
        self.config: dict[str, Any] = json.loads((path / "config.json").read_text())

    def run(self, args: list[str] | None = None) -> str:
        config = json.loads(json.dumps(self.config))
        config["process"]["terminal"] = False  # no tty here; output goes to our pipes
        if args is not None:
            config["process"]["args"] = args
        (self.path / "config.json").write_text(json.dumps(config))
        out = subprocess.run(
            ["runc", "--root", str(self.state), "run", "--bundle", str(self.path),
             f"cdra-image-{uuid.uuid4().hex[:8]}"],
            capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL, check=False,
        )  # fmt: skip
        assert out.returncode == 0, f"runc run {args}: exit {out.returncode}: {out.stderr}"
        return out.stdout


@pytest.fixture(scope="module")
def image() -> ProductImage:
    # Unpacking keeps the image's owners (root) and runc runs it: both need root. Under
    # CI=true nothing is skipped: the test fails instead.
    if os.geteuid() != 0 and os.environ.get("CI") != "true":
        pytest.skip("unpacking and running the image needs root; CI=true runs it")
    return find_product_image()  # built by hack/image/build.sh, or its cached archive


@pytest.fixture(scope="module")
def bundle(image: ProductImage, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bundle]:
    work = tmp_path_factory.mktemp("image")
    with tarfile.open(image.archive) as tar:
        tar.extractall(work / "layout", filter="data")
    subprocess.run(
        ["umoci", "unpack", "--image", f"{work / 'layout'}:{image.ref}", str(work / "bundle")],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    yield Bundle(work / "bundle", work / "runc")


def test_config_is_what_the_dockerfile_declares(image: ProductImage) -> None:
    config = image.config()["config"]
    labels = config.get("Labels") or {}
    revision = labels.get("org.opencontainers.image.revision", "")
    assert re.fullmatch(r"[0-9a-f]{40}", revision), f"revision label {revision!r}"
    declared = dockerfile(VERSION=pyproject_version(), REVISION=revision)
    # Exactly the Dockerfile's labels: nothing from the base or the builder.
    assert labels == declared.labels
    assert config["Entrypoint"] == json.loads(final_stage(declared, "ENTRYPOINT"))
    assert config["Cmd"] == json.loads(final_stage(declared, "CMD"))
    assert config["User"] == final_stage(declared, "USER") == "10001:10001"
    env = dict(e.split("=", 1) for e in config["Env"])
    assert {k: env.get(k) for k in declared.envs} == declared.envs
    # The tag says the version; the Dockerfile's own default VERSION follows pyproject.
    assert image.ref == f"localhost/composable-dra:{image.tag}"
    assert image.tag.startswith(f"{pyproject_version()}-")
    assert dockerfile().labels["org.opencontainers.image.version"] == pyproject_version()


def test_runs_the_cli_as_uid_10001_by_default(bundle: Bundle) -> None:
    assert bundle.config["process"]["user"] == {"uid": 10001, "gid": 10001}
    assert bundle.run().startswith("usage: composable-dra")  # ENTRYPOINT + CMD
    assert bundle.run(["sh", "-c", "id -u; id -g"]).split() == ["10001", "10001"]


def test_installs_exactly_what_the_recipe_asks_for(bundle: Bundle) -> None:
    freeze: dict[str, str] = {}
    for line in bundle.run(["pip", "freeze"]).splitlines():
        name, sep, version = line.partition("==")
        assert sep, f"pip freeze: {line!r} is not a pinned distribution"
        freeze[canonicalize_name(name)] = version
    inspect = json.loads(bundle.run(["pip", "inspect"]))
    installed: dict[str, dict[str, Any]] = {
        canonicalize_name(d["metadata"]["name"]): d["metadata"] for d in inspect["installed"]
    }
    wanted = installed_requirement(dockerfile())
    assert wanted.extras == {"nvml", "remote"}
    needed = required_closure(wanted, installed, inspect["environment"])
    assert freeze == {n: v for n, v in needed.items() if n not in FREEZE_HIDES}
    assert freeze["composable-dra"] == pyproject_version()
