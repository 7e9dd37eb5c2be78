"""What a pipeline and its blocks say over HTTP: frames and results as ``.npz`` bodies.

A block asks for a frame (``POST /v1/take?block=NAME``) and gets its arrays with its
number (header ``X-Frame``), or 204 when none came in time; it answers with the
function's results (``POST /v1/answer?block=NAME&frame=N``). Both sides read bodies
from the network, so reading is bounded and typed: numpy's own ``.npz`` reader with
pickles refused, at most ``MAX_ARRAYS`` arrays, a block name that is a DNS label (a pod
name) or ``lease-<n>``, a frame number that is a decimal int. Anything else is
:class:`BadBlockRequest`, and nothing of the dispatcher changes.
"""

from __future__ import annotations

import io
import re
import zipfile
from collections.abc import Mapping, Sequence

import numpy as np

MAX_ARRAYS = 8
FRAME_HEADER = "X-Frame"
_BLOCK = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_FRAME = re.compile(r"^[0-9]{1,18}$")


class BadBlockRequest(ValueError):
    """A request or body a pipeline or block will not read."""


def encode(arrays: Sequence[np.ndarray]) -> bytes:
    out = io.BytesIO()
    np.savez(out, *arrays)
    return out.getvalue()


def _stored_only(body: bytes) -> None:
    """Refuse compressed members: a small body must not unpack into a large one."""
    with zipfile.ZipFile(io.BytesIO(body)) as z:
        infos = z.infolist()
        if any(i.compress_type != zipfile.ZIP_STORED for i in infos):
            raise BadBlockRequest("compressed arrays are refused")
        if sum(i.file_size for i in infos) > len(body):
            raise BadBlockRequest("members larger than the body")


def decode(body: bytes) -> tuple[np.ndarray, ...]:
    """The arrays of an ``.npz`` body, in order; BadBlockRequest for anything else."""
    try:
        _stored_only(body)
        with np.load(io.BytesIO(body), allow_pickle=False) as npz:
            names = list(npz.files)
            if not 1 <= len(names) <= MAX_ARRAYS:
                raise BadBlockRequest(f"a body holds 1 to {MAX_ARRAYS} arrays, not {len(names)}")
            order = [f"arr_{i}" for i in range(len(names))]
            if sorted(names) != sorted(order):
                raise BadBlockRequest(f"arrays must be named arr_0..: got {sorted(names)[:4]}")
            arrays = tuple(npz[n] for n in order)
        if not all(isinstance(a, np.ndarray) for a in arrays):
            raise BadBlockRequest("a member is not an .npy array")
        return arrays
    except BadBlockRequest:
        raise
    except (ValueError, OSError, EOFError, KeyError, zipfile.BadZipFile, AttributeError) as exc:
        raise BadBlockRequest(f"not an .npz of arrays: {type(exc).__name__}") from None


def block_name(query: Mapping[str, str]) -> str:
    name = query.get("block", "")
    if not _BLOCK.match(name):
        raise BadBlockRequest("block must be a DNS label (a pod name)")
    return name


def frame_number(query: Mapping[str, str]) -> int:
    raw = query.get("frame", "")
    if not _FRAME.match(raw):
        raise BadBlockRequest("frame must be a decimal number")
    return int(raw)
