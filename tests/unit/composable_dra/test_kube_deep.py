"""One claim nested as deep as the API server accepts stalls nothing (issue 25, item 2).

The API server accepts opaque parameters of up to 10 KiB, as deep as that allows (about
5,000 levels of arrays), in a body of up to 10,000 levels. ``json.loads`` raised
RecursionError on such a claim, so every LIST and watch of claims failed and each
informer retried forever. Only names that were there before the fix are used, so this
file shows the failure on the code before it.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from composable_dra.k8s.frozen import freeze
from composable_dra.k8s.informer import Informer
from composable_dra.lending.remote_leases import Code, DonorDirectory, LeaseAPIError, LeaseClient
from composable_dra.model.gpu_config import ConfigError, claim_configs
from remote_gpu.claim_config import lease_of_claim
from tests.unit.composable_dra.deep_claims import (
    DRIVER,
    GOOD,
    claim,
    claim_list,
    kube,
    nested,
    worst_parameters,
)

# -- a LIST and a watch of claims with one too deep ---------------------------------------


@pytest.mark.parametrize("bad", [nested(1000), worst_parameters()], ids=["1000", "worst"])
def test_a_list_with_a_deep_claim_gives_every_claim(bad: str) -> None:
    """Before: RecursionError on the whole LIST, so no claim was read."""
    body = kube(claim_list(claim("good", GOOD), claim("bad", '{"a":' + bad + "}"))).get(
        "/apis/resource.k8s.io/v1/resourceclaims"
    )
    good, deep = body["items"]
    assert good == json.loads(claim("good", GOOD))
    assert deep["metadata"] == {
        "name": "bad",
        "namespace": "other",
        "uid": "uid-bad",
        "resourceVersion": "7",
    }
    # Every walk after the decode is safe on it: the informer's, a reader's copy, a log's.
    frozen = freeze(deep)
    copy.deepcopy(frozen)
    repr(frozen)
    # Our driver's config there is refused with a typed error.
    with pytest.raises(ConfigError):
        claim_configs(deep["status"]["allocation"]["devices"]["config"], DRIVER)


def test_an_informer_serves_claims_beside_a_deep_one() -> None:
    """Listed and watched through Kube: the informer syncs, caches both, keeps watching."""
    deep = claim("bad", worst_parameters())
    added = '{"type":"ADDED","object":%s}' % claim("late", nested(2000))  # noqa: UP031
    api = kube(claim_list(claim("good", GOOD), deep), [added.encode()])
    inf = Informer(api, "/apis/resource.k8s.io/v1/resourceclaims", retry_cap=0.05).start()
    try:
        assert inf.wait_for(lambda items: len(items) == 3, timeout=10)
    finally:
        inf.stop()
    assert sorted(inf.cached_keys()) == ["other/bad", "other/good", "other/late"]


def test_deep_params_in_a_claim_refuse_its_slo() -> None:
    raw = claim("bad", '{"kind":"GpuConfig","latencySLO":%s}' % nested(1500, "{"))  # noqa: UP031
    deep = kube(claim_list(raw)).get("/x")["items"][0]
    with pytest.raises(ConfigError, match="latencySLO"):
        lease_of_claim(deep, DRIVER, "donor", "gpu-0-remote")


def test_a_deep_answer_from_a_donor_is_a_typed_error() -> None:
    class Answer:
        status = 200

        def read(self, amt: int) -> bytes:
            return b'{"leases":' + nested(3000).encode() + b"}"

        def release_conn(self) -> None:
            pass

    class Http:
        def request(self, *args: Any, **kwargs: Any) -> Answer:
            return Answer()

    class Tokens:
        def token(self, aud: str) -> str:
            return "t"

    client = LeaseClient(DonorDirectory(), Tokens())
    client._http = Http()  # type: ignore[assignment]
    with pytest.raises(LeaseAPIError) as err:
        client.list("donor")
    assert err.value.code is Code.INTERNAL
