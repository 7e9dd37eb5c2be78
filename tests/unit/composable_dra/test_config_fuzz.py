"""The opaque config parser on arbitrary JSON: a GpuConfig or a ConfigError, nothing else."""

from __future__ import annotations

from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from composable_dra.model.gpu_config import (
    API_VERSION,
    KIND,
    ConfigError,
    claim_configs,
    parse_parameters,
)
from tests.unit.dra_driver.plugin_fixtures import DRIVER
from tests.unit.fuzz_json import JSON_VALUES

_json = JSON_VALUES
# Mostly well-addressed GpuConfigs, so the fields themselves get exercised.
_parameters = st.one_of(
    _json,
    st.fixed_dictionaries(
        {"apiVersion": st.just(API_VERSION), "kind": st.just(KIND)},
        optional={
            "sharing": st.sampled_from(["Exclusive", "Shared"]),
            "env": st.one_of(
                st.dictionaries(
                    st.one_of(
                        st.sampled_from(["A", "MY_VAR", "GOOD\n", "_"]),
                        st.text(alphabet=st.sampled_from("AZaz09_\n\x00 =-$"), max_size=8),
                    ),
                    st.one_of(
                        st.text(max_size=8),
                        st.text(alphabet=st.sampled_from("a=\n\r\x00"), max_size=4),
                        _json,
                    ),
                    max_size=4,
                ),
                _json,
            ),
        },
    ),
)


def _valid_env(env: dict[str, str]) -> None:
    for name, value in env.items():
        assert name.isascii() and name.replace("_", "a").isalnum() and not name[0].isdigit()
        assert not {"\x00", "\n", "\r"} & set(value)


@settings(max_examples=400)
@given(parameters=_parameters)
@example(parameters={"apiVersion": API_VERSION, "kind": KIND, "env": {"GOOD\n": "x"}})
@example(parameters={"apiVersion": API_VERSION, "kind": KIND, "env": {"A": "x\x00"}})
@example(parameters={"apiVersion": API_VERSION, "kind": KIND, "bogus": [[[]]]})
def test_fuzz_parse_parameters(parameters: Any) -> None:
    try:
        cfg = parse_parameters(parameters)
    except ConfigError as exc:
        assert str(exc)
        return
    assert cfg.sharing in ("Exclusive", "Shared")
    _valid_env(cfg.env)


@settings(max_examples=200)
@given(
    configs=st.lists(
        st.one_of(
            _json,
            st.fixed_dictionaries(
                {
                    "opaque": st.fixed_dictionaries(
                        {"driver": st.just(DRIVER), "parameters": _parameters}
                    )
                },
                optional={"requests": _json, "source": _json},
            ),
        ),
        max_size=3,
    )
)
def test_fuzz_claim_configs(configs: list[Any]) -> None:
    try:
        merged = claim_configs(configs, DRIVER).for_request("gpu")
    except ConfigError as exc:
        assert str(exc)
        return
    _valid_env(merged.env)
