"""Which functions run on a GPU, with numpy only: a stand-in device library records
what ran where; the real libraries are looked for and (here) not found."""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from remote_gpu import backends, builtins
from remote_gpu.backends import Backend, BackendError


class OnDevice:
    """An array 'on the device' of the stand-in library."""

    def __init__(self, a: np.ndarray) -> None:
        self.a = a


def fake_backend(calls: list[str]) -> Backend:
    def matmul(x: OnDevice, y: OnDevice) -> OnDevice:
        assert isinstance(x, OnDevice) and isinstance(y, OnDevice)  # copied there first
        calls.append("matmul")
        return OnDevice(np.matmul(x.a, y.a))

    return Backend("fakegpu", SimpleNamespace(matmul=matmul), OnDevice, lambda d: np.asarray(d.a))


def test_a_function_with_a_kernel_runs_on_the_device_and_returns_numpy() -> None:
    calls: list[str] = []
    gpu = fake_backend(calls)
    path = "remote_gpu.builtins:matmul"
    assert backends.choose(path, builtins.matmul, gpu) == "fakegpu"
    fn = backends.place(path, builtins.matmul, gpu)
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = fn(a, a.T)
    assert calls == ["matmul"]
    assert isinstance(out, np.ndarray) and np.array_equal(out, a @ a.T)


@pytest.mark.parametrize(
    ("path", "fn"),
    [
        ("remote_gpu.builtins:echo", builtins.echo),  # no kernel: numpy as written
        ("remote_gpu.builtins:add", builtins.add),  # a kernel the library lacks
        ("remote_gpu.builtins:feature_extract", builtins.feature_extract),
    ],
)
def test_functions_without_a_usable_kernel_stay_on_numpy(path: str, fn: Callable[..., Any]) -> None:
    gpu = fake_backend([])
    assert backends.choose(path, fn, gpu) == "numpy"
    assert backends.place(path, fn, gpu) is fn


def test_no_gpu_means_numpy_for_every_function() -> None:
    assert backends.choose("remote_gpu.builtins:matmul", builtins.matmul, None) == "numpy"
    assert backends.place("remote_gpu.builtins:matmul", builtins.matmul, None) is builtins.matmul


def test_either_spelling_of_the_path_and_a_declared_kernel() -> None:
    assert backends.kernel_name("remote_gpu.builtins.matmul", builtins.matmul) == "matmul"

    def mine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return a

    assert backends.kernel_name("my.module:mine", mine) is None
    mine.gpu_kernel = "matmul"  # type: ignore[attr-defined]
    assert backends.choose("my.module:mine", mine, fake_backend([])) == "fakegpu"


def test_detect_order_force_and_refusal() -> None:
    calls: list[str] = []
    cupy = fake_backend(calls)
    none: dict[str, Callable[[], Backend | None]] = {"cupy": lambda: None, "torch": lambda: None}
    both: dict[str, Callable[[], Backend | None]] = {"cupy": lambda: cupy, "torch": lambda: None}
    assert backends.detect("auto", none) is None
    assert backends.detect("auto", both) is cupy
    assert backends.detect("numpy", both) is None  # forced: never the GPU
    assert backends.detect("cupy", both) is cupy
    with pytest.raises(BackendError, match="torch has no usable GPU"):
        backends.detect("torch", both)
    with pytest.raises(BackendError, match="not one of"):
        backends.detect("opencl", both)


def test_this_machine_without_a_gpu_library_serves_with_numpy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # No CuPy or PyTorch (hidden where installed: a None module fails its import): auto
    # finds nothing, a forced one refuses.
    monkeypatch.setitem(sys.modules, "cupy", None)
    monkeypatch.setitem(sys.modules, "torch", None)
    assert backends.from_env({}) is None
    assert backends.from_env({backends.ENV: "numpy"}) is None
    with pytest.raises(BackendError):
        backends.from_env({backends.ENV: "cupy"})
