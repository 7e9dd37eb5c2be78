"""The per-claim QoS rule (composable_dra.lending.qos): fits, headroom, what is published."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from composable_dra.lending import qos

HOST = qos.HostProfile(slowdown_at_full=0.12)
NW = qos.QosProfile(transfer=0.2048, tolerance=0.1, host_load=0.48)
HOTSPOT = qos.QosProfile(transfer=0.002, tolerance=0.1, host_load=0.04)


def test_a_network_bound_job_refuses_a_loaded_link_that_a_light_one_takes() -> None:
    loaded = qos.DeviceLoad(host_slowdown=0.0, link_load=0.5, headroom=1.0)
    assert not qos.fits(NW, loaded)
    assert qos.fits(HOTSPOT, loaded)
    idle = qos.DeviceLoad(host_slowdown=0.0, link_load=0.0, headroom=1.0)
    assert qos.fits(NW, idle)


def test_a_local_device_is_judged_by_host_slowdown_against_the_plain_tolerance() -> None:
    assert qos.fits(NW, qos.DeviceLoad(host_slowdown=0.1, link_load=None, headroom=1.0))
    assert not qos.fits(NW, qos.DeviceLoad(host_slowdown=0.11, link_load=None, headroom=1.0))


def test_headroom_protects_the_running_job_with_the_least_budget() -> None:
    # Host at 0.5 load; a job of load 0.1 running there with tolerance 0.1 may take
    # 0.1 / 0.12 = 0.833 of others' load; others are 0.4 now, so 0.433 more.
    running = [(qos.QosProfile(transfer=0.0, tolerance=0.1, host_load=0.1), False)]
    assert qos.headroom(0.5, running, HOST) == pytest.approx(0.1 / 0.12 - 0.4)
    assert qos.headroom(0.5, [], HOST) == 1.0
    # Full: nothing more fits.
    assert qos.headroom(1.0, running, HOST) == 0.0
    blocked = qos.DeviceLoad(host_slowdown=0.0, link_load=None, headroom=0.4)
    assert not qos.fits(NW, blocked)
    assert qos.fits(HOTSPOT, blocked)


def test_published_values_round_to_the_safe_side_in_steps() -> None:
    a = qos.published(qos.DeviceLoad(host_slowdown=0.0101, link_load=0.999, headroom=0.049))
    assert a == {qos.HOST_SLOWDOWN: 25, qos.LINK_LOAD: qos.MAX_LINK_LOAD, qos.HEADROOM: 25}
    assert qos.LINK_LOAD not in qos.published(qos.DeviceLoad(0.0, None, 1.0))


@given(
    st.floats(0, 0.3),
    st.one_of(st.none(), st.floats(0, 1)),
    st.floats(0, 1),
    st.floats(0, 0.5),
    st.floats(0.01, 0.5),
    st.floats(0, 1),
)
def test_publishing_never_makes_a_device_look_better(
    slow: float, link: float | None, room: float, f: float, t: float, load: float
) -> None:
    d = qos.DeviceLoad(slow, link, room)
    p = qos.QosProfile(f, t, load)
    if qos.fits(p, qos.as_published(d)):
        assert qos.fits(p, d) or (link is not None and link > qos.MAX_LINK_LOAD / qos.SCALE)


@pytest.mark.parametrize(
    "bad",
    [
        {"transfer": -0.1, "tolerance": 0.1, "host_load": 0.1},
        {"transfer": 0.1, "tolerance": 0.0, "host_load": 0.1},
        {"transfer": 0.1, "tolerance": 0.1, "host_load": 1.5},
    ],
)
def test_a_profile_out_of_range_is_refused(bad: dict[str, float]) -> None:
    with pytest.raises(qos.ProfileError):
        qos.QosProfile(**bad)


def test_the_selector_names_the_profile_and_the_domain() -> None:
    cel = qos.cel_selector(NW, "gpu.composable.dra.io")
    assert 'device.attributes["gpu.composable.dra.io"].hostHeadroom >= 480' in cel
    assert cel.startswith(
        'device.driver == "gpu.composable.dra.io" && '
        '(!("hostSlowdown" in device.attributes["gpu.composable.dra.io"])'
    )
