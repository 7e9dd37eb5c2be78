"""A request refused with 401: log in again and repeat it, once. One rule for the HTTP
backends (a Redfish session, an Fsas token), whatever their credential is.

The refused request changed nothing, so repeating it cannot apply a change twice. The
credential it went with is named to ``renew``, so that of concurrent callers who all saw
the 401, one renews it and the others use what that one got.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from composable_dra.fabric.errors import AuthError

A = TypeVar("A")  # what a request answers
C = TypeVar("C")  # the credential it went with
UNAUTHORIZED = 401


def once_more_after_401(
    send: Callable[[], tuple[int, A, C]], renew: Callable[[C], object], what: str
) -> A:
    """``send``'s answer; after a 401 (``send`` gives its status, its answer and the
    credential used), the answer to one more ``send`` once ``renew`` replaced that
    credential. AuthError when that one is refused too."""
    status, answer, used = send()
    if status != UNAUTHORIZED:
        return answer
    renew(used)
    status, answer, _ = send()
    if status == UNAUTHORIZED:
        raise AuthError(f"{what}: still unauthorized after logging in again")
    return answer
