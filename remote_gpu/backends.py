"""Where a donor's allow-listed functions run: on the node's GPU when there is one.

A lease's worker looks for a GPU array library once (``detect``): CuPy, else PyTorch
with CUDA (the optional extras ``gpu`` and ``gpu-torch``), else none. Then, per function
(``choose``), a function that has a device kernel runs on the GPU: its arguments are
copied to the device, the kernel runs there, and its results come back as numpy arrays
(the worker writes them into the lease's slot as before). Every other function, and
every function when no GPU is usable, runs with numpy as written.

Which functions have a device kernel: the builtins listed in ``KERNELS`` (by import
path), and any function with a ``gpu_kernel`` attribute naming the array library's
function (``matmul``, ``add``): the same name in CuPy and in PyTorch.

``REMOTE_GPU_BACKEND`` (the donor's ``--backend``) chooses: ``auto`` (the default),
``numpy`` (never a GPU: the flag to force numpy), ``cupy`` or ``torch`` (that library or
a :class:`BackendError` when it has no usable GPU: a donor that must serve on the GPU
does not quietly fall back).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

ENV = "REMOTE_GPU_BACKEND"
CHOICES = ("auto", "numpy", "cupy", "torch")
# Builtins written with numpy functions that the GPU libraries have under the same name.
KERNELS: Mapping[str, str] = {
    "remote_gpu.builtins:matmul": "matmul",
    "remote_gpu.builtins:add": "add",
}


class BackendError(Exception):
    """The backend asked for cannot be used on this node."""


@dataclass(frozen=True)
class Backend:
    """A GPU array library: its namespace of kernels and the copies to and from it."""

    name: str
    namespace: Any
    to_device: Callable[[np.ndarray], Any]
    to_host: Callable[[Any], np.ndarray]


def _cupy() -> Backend | None:
    try:
        cupy: Any = importlib.import_module("cupy")
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return None
    except Exception:  # not installed, or no driver / device: numpy then
        return None
    return Backend("cupy", cupy, cupy.asarray, cupy.asnumpy)


def _torch() -> Backend | None:
    try:
        torch: Any = importlib.import_module("torch")
        if not torch.cuda.is_available():
            return None
    except Exception:
        return None

    def to_device(a: np.ndarray) -> Any:
        return torch.as_tensor(a, device="cuda")

    def to_host(t: Any) -> np.ndarray:
        out: np.ndarray = t.cpu().numpy()
        return out

    return Backend("torch", torch, to_device, to_host)


_LOADERS: dict[str, Callable[[], Backend | None]] = {"cupy": _cupy, "torch": _torch}


def detect(
    choice: str = "auto", loaders: Mapping[str, Callable[[], Backend | None]] | None = None
) -> Backend | None:
    """The GPU backend for ``choice``; None means numpy."""
    loaders = _LOADERS if loaders is None else loaders
    if choice not in CHOICES:
        raise BackendError(f"backend {choice!r} is not one of {', '.join(CHOICES)}")
    if choice == "numpy":
        return None
    for name in ("cupy", "torch") if choice == "auto" else (choice,):
        backend = loaders[name]()
        if backend is not None:
            return backend
    if choice != "auto":
        raise BackendError(f"backend {choice} has no usable GPU on this node")
    return None


def from_env(env: Mapping[str, str] | None = None) -> Backend | None:
    env = os.environ if env is None else env
    return detect(env.get(ENV, "auto") or "auto")


def canonical(path: str) -> str:
    """``module:function`` for either spelling the allow-list accepts."""
    if ":" in path:
        return path
    module, _, name = path.rpartition(".")
    return f"{module}:{name}"


def kernel_name(path: str, fn: Callable[..., Any]) -> str | None:
    """The device kernel of the function at import path ``path``, None if it has none."""
    named = getattr(fn, "gpu_kernel", None)
    if isinstance(named, str) and named:
        return named
    return KERNELS.get(canonical(path))


def choose(path: str, fn: Callable[..., Any], backend: Backend | None) -> str:
    """Where this function runs: the backend's name, or ``numpy``."""
    kernel = kernel_name(path, fn)
    if backend is None or kernel is None or not hasattr(backend.namespace, kernel):
        return "numpy"
    return backend.name


def place(path: str, fn: Callable[..., Any], backend: Backend | None) -> Callable[..., Any]:
    """``fn`` as the worker calls it: on the device when ``choose`` says so."""
    if choose(path, fn, backend) == "numpy":
        return fn
    assert backend is not None
    kernel = getattr(backend.namespace, kernel_name(path, fn) or "")
    to_device, to_host = backend.to_device, backend.to_host

    def on_device(*arrays: np.ndarray) -> Any:
        out = kernel(*(to_device(a) for a in arrays))
        if isinstance(out, tuple | list):
            return tuple(to_host(o) for o in out)
        return to_host(out)

    on_device.__name__ = getattr(fn, "__name__", "on_device")
    on_device.backend = backend.name  # type: ignore[attr-defined]
    return on_device
