from __future__ import annotations

from composable_dra.serving.token_bucket import TokenBucket
from remote_gpu.admission import AdmissionController, measure_bandwidth
from remote_gpu.transports import choose


def test_admission_stops_before_the_link_saturates() -> None:
    ctl = AdmissionController(bandwidth_bps=100e6)
    demand = ctl.demand(920_000, 1 / 0.066)  # ~13.9 MB/s per lease
    assert ctl.predict_max_leases(demand) == 7
    admitted = [lease for lease in range(10) if ctl.try_admit(lease, demand)]
    assert admitted == list(range(7))
    ctl.release(3)
    assert ctl.try_admit(42, demand)
    assert not ctl.try_admit(43, demand)


def test_no_bandwidth_means_no_limit() -> None:
    ctl = AdmissionController(None)
    assert all(ctl.try_admit(i, 1e12) for i in range(5))


def test_measured_loopback_bandwidth_is_positive() -> None:
    assert measure_bandwidth("127.0.0.1", seconds=0.15) > 10e6


def test_token_bucket_limits_rate() -> None:
    bucket = TokenBucket(rate=10, burst=2)
    t0 = bucket.stamp
    assert bucket.take(t0) and bucket.take(t0)
    assert not bucket.take(t0)
    assert bucket.take(t0 + 0.15)
    assert TokenBucket(0, 1).take()


def test_transport_choice() -> None:
    assert choose("auto", ["shm", "tcp"], same_host=True) == "shm"
    assert choose("auto", ["shm", "tcp"], same_host=False) == "tcp"
    assert choose("auto", ["ucx", "tcp"], same_host=False) == "ucx"
    assert choose("tcp", ["shm", "tcp"], same_host=True) == "tcp"


def test_link_use_is_exported() -> None:
    from remote_gpu import metrics

    ctl = AdmissionController(bandwidth_bps=100e6, headroom=0.9)
    assert metrics.LINK_CAPACITY._value.get() == 90e6
    ctl.try_admit(1, 10e6)
    ctl.try_admit(2, 20e6)
    assert metrics.LINK_ADMITTED._value.get() == 30e6
    ctl.release(1)
    assert metrics.LINK_ADMITTED._value.get() == 20e6
    AdmissionController(None)
    assert metrics.LINK_CAPACITY._value.get() == 0
