"""Hostile claim references from the kubelet socket: refused per claim, no file touched.

Over the real gRPC unix socket, and fuzzed (bounded) against the servicers directly.
"""

from __future__ import annotations

import os
import shutil
import string
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from api.dra.v1 import api_pb2 as v1
from api.dra.v1beta1 import api_pb2 as v1beta1
from dra_driver import claimref
from dra_driver.cdi import CdiWriter
from dra_driver.checkpoint import Checkpoint
from dra_driver.grpc_server import DRAServicer
from dra_driver.prepare import Preparer
from tests.unit.dra_driver.plugin_fixtures import DRIVER, NODE, claim, gpu, result
from tests.unit.dra_driver.test_plugin_grpc import Plugin
from tests.unit.dra_driver.test_plugin_prepare import FakeApi

HOSTILE_UID = "y/../../victim"


@pytest.fixture
def served() -> Iterator[Plugin]:
    """The plugin on real unix sockets (in /tmp: socket paths are limited to 107 bytes)."""
    tmp = Path(tempfile.mkdtemp(prefix="cdra-", dir="/tmp"))
    p = Plugin(tmp)
    p.start()
    yield p
    p.close()
    shutil.rmtree(tmp, ignore_errors=True)


def files_under(root: Path) -> dict[str, bytes]:
    out = {}
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            p = Path(dirpath) / name
            if not p.is_socket():
                out[str(p.relative_to(root))] = p.read_bytes()
    return out


def test_unprepare_with_a_traversing_uid_deletes_nothing_outside(served: Plugin) -> None:
    # What an earlier prepare of the same UID would have left: the directory the
    # traversal needs, and a file beside the CDI directory it points at.
    (served.cdi_dir / "composable.dra.io-gpu_y").mkdir(parents=True)
    victim = served.tmp / "victim.json"
    victim.write_text("not the plugin's")
    resp = served.v1().NodeUnprepareResources(
        v1.NodeUnprepareResourcesRequest(
            claims=[v1.Claim(namespace="default", name="c1", uid=HOSTILE_UID)]
        ),
        timeout=5,
    )
    assert victim.read_text() == "not the plugin's"
    assert "invalid claim UID" in resp.claims[HOSTILE_UID].error


def test_prepare_with_a_traversing_uid_writes_nothing_and_asks_no_one(served: Plugin) -> None:
    # Even an API server that agrees with the UID (a fake one) gets no question.
    served.api.add(claim(name="c1", uid=HOSTILE_UID, results=[result("gpu-0")]))
    before = files_under(served.tmp)
    resp = served.v1().NodePrepareResources(
        v1.NodePrepareResourcesRequest(
            claims=[v1.Claim(namespace="default", name="c1", uid=HOSTILE_UID)]
        ),
        timeout=5,
    )
    assert "invalid claim UID" in resp.claims[HOSTILE_UID].error
    assert not resp.claims[HOSTILE_UID].devices
    assert files_under(served.tmp) == before
    assert served.api.gets == 0


@pytest.mark.parametrize(
    ("namespace", "name", "why"),
    [
        ("default", "../../nodes/n1", "invalid claim name"),
        ("default", "a/b", "invalid claim name"),
        ("..", "c1", "invalid claim namespace"),
        ("kube-system/pods", "c1", "invalid claim namespace"),
        ("default", "C1", "invalid claim name"),
        ("default\n", "c1", "invalid claim namespace"),
    ],
)
def test_bad_names_are_refused_for_that_claim_only(
    served: Plugin, namespace: str, name: str, why: str
) -> None:
    good = claim(name="good", results=[result("gpu-1")])
    served.api.add(good)
    bad_uid = "0b6c1a52-0000-4000-8000-000000000001"
    req = v1.NodePrepareResourcesRequest(
        claims=[
            v1.Claim(namespace=namespace, name=name, uid=bad_uid),
            v1.Claim(namespace="default", name="good", uid=good["metadata"]["uid"]),
        ]
    )
    resp = served.v1().NodePrepareResources(req, timeout=5)
    assert why in resp.claims[bad_uid].error
    assert resp.claims[good["metadata"]["uid"]].error == ""
    assert served.api.gets == 1  # only the good claim was looked up


def test_the_cdi_writer_refuses_paths_outside_its_directory(tmp_path: Path) -> None:
    writer = CdiWriter(tmp_path / "cdi", durable=False)
    for uid in (HOSTILE_UID, "..", "a/b", "", "x\n", "x\x00"):
        with pytest.raises(claimref.InvalidClaimRef):
            writer.path_for(uid)
        with pytest.raises(claimref.InvalidClaimRef):
            writer.write(uid, {})
        with pytest.raises(claimref.InvalidClaimRef):
            writer.remove(uid)
    assert not (tmp_path / "cdi").exists()
    ok = "2b2f0e54-6c4f-4c8e-9d1a-0e6f8d1c2b3a"
    assert writer.path_for(ok).parent == tmp_path / "cdi"


def test_real_references_pass() -> None:
    assert (
        claimref.problem("default", "my-claim.v2", "2b2f0e54-6c4f-4c8e-9d1a-0e6f8d1c2b3a") is None
    )
    assert claimref.problem("a" * 63, "b" * 253, "u" * 128) is None
    assert claimref.problem("a" * 64, "c", "u") is not None
    assert claimref.problem("a", "b" * 254, "u") is not None
    assert claimref.problem("a", "b", "u" * 129) is not None


# ---- fuzz: arbitrary strings in every field, both API versions ---------------------------

_fields = st.one_of(
    st.text(max_size=40),
    st.text(alphabet=string.ascii_letters + string.digits + "-./\\\x00\n%", max_size=40),
    st.sampled_from(["..", ".", "/", HOSTILE_UID, "../victim", "default", "c1"]),
)
_claims = st.lists(st.tuples(_fields, _fields, _fields), min_size=1, max_size=4)


@settings(max_examples=300)
@given(claims=_claims, beta=st.booleans())
def test_fuzz_grpc_claim_fields(
    tmp_path: Path, claims: list[tuple[str, str, str]], beta: bool
) -> None:
    root = tmp_path / "fuzz"
    root.mkdir(exist_ok=True)
    cdi_dir = root / "a" / "b" / "cdi"
    # The traversal target directories exist, so a path that escaped would succeed.
    (cdi_dir / "composable.dra.io-gpu_y").mkdir(parents=True, exist_ok=True)
    bait = root / "a" / "victim.json"
    bait.write_text("bait")
    api = FakeApi()
    for ns, name, uid in claims:
        # The fake API server answers with a claim that matches whatever was asked.
        api.claims[(ns, name)] = claim(name=name, namespace=ns, uid=uid, results=[result("gpu-0")])
    preparer = Preparer(
        DRIVER,
        NODE,
        api,
        lambda: [gpu(0)],
        Checkpoint(root / "state" / "checkpoint.json", "boot"),
        CdiWriter(cdi_dir, durable=False),
    )
    module: Any = v1beta1 if beta else v1
    servicer: Any = DRAServicer(preparer, module)
    msgs = [module.Claim(namespace=ns, name=name, uid=uid) for ns, name, uid in claims]
    outside_before = {
        k: v for k, v in files_under(root).items() if not k.startswith(("a/b/cdi/", "state/"))
    }

    prepared = servicer.NodePrepareResources(module.NodePrepareResourcesRequest(claims=msgs), None)
    for ns, name, uid in claims:
        why = claimref.problem(ns, name, uid)
        entry = prepared.claims[uid]
        if why is not None and all(claimref.problem(*c) is not None for c in claims if c[2] == uid):
            assert entry.error and not entry.devices
    for spec in cdi_dir.glob("*.json"):
        assert spec.parent == cdi_dir
    unprepared = servicer.NodeUnprepareResources(
        module.NodeUnprepareResourcesRequest(claims=msgs), None
    )
    assert set(unprepared.claims) == {uid for _, _, uid in claims}

    outside_after = {
        k: v for k, v in files_under(root).items() if not k.startswith(("a/b/cdi/", "state/"))
    }
    assert outside_after == outside_before
    assert bait.read_text() == "bait"
    assert not list(cdi_dir.glob("*.json"))  # everything prepared was unprepared
