"""A fabric's HTTP answer, read within bounds: whole within the call's deadline, at most
a byte cap, and its JSON neither too deep nor with ``NaN``/``Infinity``.

requests' ``timeout`` bounds each socket read, not the call: an answer trickled a byte at
a time held a 5 s call for 40 s, and ``resp.json()`` read any size and raised
RecursionError on deep JSON. Here the body is read with ``stream=True`` in ``read1``
steps (each returns what has arrived), the socket's timeout set to the time left before
each, so a call ends by its deadline; everything that goes wrong is a typed FabricError.
"""

from __future__ import annotations

import http.client
import time
from collections.abc import Callable
from typing import Any

import requests
import urllib3

from composable_dra.fabric import bounded_json
from composable_dra.fabric.errors import BadAnswerError, TransientError

MAX_ANSWER = 16 << 20  # bytes; an FM's machine list of thousands of GPUs is a few MiB
MAX_DEPTH = 64  # the deepest answer a fabric API gives is under 10 levels
_STEP = 64 << 10  # bytes asked of one read


def read_body(
    resp: requests.Response,
    deadline: float,
    what: str,
    *,
    cap: int = MAX_ANSWER,
    clock: Callable[[], float] = time.monotonic,
) -> bytes:
    """The whole body of a streamed answer (``stream=True``) by ``deadline`` (on
    ``clock``): TransientError when time runs out or the connection fails, BadAnswerError
    over ``cap`` bytes. The response is closed unless it was read to its end (then its
    connection is back in the pool)."""
    got = bytearray()
    complete = False
    try:
        while True:
            left = deadline - clock()
            if left <= 0:
                raise TransientError(f"{what}: no whole answer within the call's time limit")
            _read_timeout(resp, left)
            chunk = resp.raw.read1(min(_STEP, cap + 1 - len(got)))
            if not chunk:
                complete = True
                return bytes(got)
            got += chunk
            if len(got) > cap:
                raise BadAnswerError(f"{what}: an answer of more than {cap} bytes")
    except (urllib3.exceptions.ReadTimeoutError, TimeoutError) as exc:
        # Each read waits at most until the deadline: a timeout is the deadline's.
        raise TransientError(f"{what}: no whole answer within the call's time limit") from exc
    except (urllib3.exceptions.HTTPError, http.client.HTTPException, OSError) as exc:
        raise TransientError(f"{what}: reading the answer: {type(exc).__name__}") from exc
    finally:
        if not complete:
            resp.close()  # a half-read answer must not go back to the pool


def _read_timeout(resp: requests.Response, left: float) -> None:
    """Bound the next socket read by the time left (urllib3 set the call's whole timeout
    on the socket once, before the headers)."""
    connection = getattr(resp.raw, "connection", None)
    sock = getattr(connection, "sock", None)
    if sock is not None:
        sock.settimeout(max(left, 0.001))


def parse_json(raw: bytes, what: str, *, max_depth: int = MAX_DEPTH) -> Any:
    """The JSON value of ``raw``; BadAnswerError for anything else (bounded_json)."""
    try:
        return bounded_json.loads(raw, max_depth)
    except ValueError as exc:
        raise BadAnswerError(f"{what}: not JSON: {str(exc)[:80]}") from None
