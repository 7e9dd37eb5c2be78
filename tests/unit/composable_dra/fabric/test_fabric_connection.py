"""The one TLS decision of every fabric client (composable_dra/fabric/connection.py):
verified by default, against the Fabric's CA when it has one, off only when told."""

from __future__ import annotations

import certifi

from composable_dra.fabric.connection import Connection


def test_verified_against_the_certifi_bundle_by_default() -> None:
    # The DMTF client verifies nothing unless handed a file: the default must be one.
    assert Connection().ca_bundle() == certifi.where()


def test_the_fabrics_ca_when_it_has_one() -> None:
    assert Connection(ca_file="/run/fabric-ca/lab.crt").ca_bundle() == "/run/fabric-ca/lab.crt"


def test_no_verification_only_when_told() -> None:
    told = Connection(ca_file="/run/fabric-ca/lab.crt", insecure_skip_tls_verify=True)
    assert told.ca_bundle() is None
