"""The lease API's TokenReviews: who a bearer is, asked of the API server, cheaply.

Every bearer costs a TokenReview, and a TokenReview may be slow. So:

- answers (yes or no) are reused for ``ttl`` seconds, by the token's digest; a burst of one
  token, or the same bad token again and again, costs one review. An API server that does
  not answer is not remembered: the next call asks again.
- concurrent calls with one token share its one review.
- bearers the API server never authenticated here ("unknown") share ``UNKNOWN_LANE``
  reviewer threads; when all are busy a new unknown bearer is refused at once
  (``UNAVAILABLE`` with a Retry-After) rather than queued. Bearers it did authenticate
  ("known": the controller's and the plugins' tokens after their first call) have
  reviewer threads of their own, so a flood of made-up bearers never queues an
  authorized call behind it.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from composable_dra.lending.remote_leases import Code, LeaseAPIError
from remote_gpu.identity import Identity

REVIEW_SECONDS = 10.0  # how long a TokenReview's answer is reused
REVIEW_CACHE = 4096  # answers, and known bearers, kept at most
UNKNOWN_LANE = 4  # reviews of unknown bearers in flight at most
KNOWN_LANE = 4  # reviewer threads kept for known bearers
BUSY_RETRY_S = 1.0  # Retry-After for an unknown bearer turned away while the lane is full

Answer = Identity | LeaseAPIError


class Reviewer(Protocol):
    def review(self, token: str, audiences: tuple[str, ...]) -> Identity: ...


class Reviews:
    """``who(token)``: the caller a token names, through ``reviewer`` (blocking; run on
    this object's threads). Use from one event loop."""

    def __init__(
        self,
        reviewer: Reviewer,
        audiences: tuple[str, ...],
        ttl: float = REVIEW_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._reviewer, self._audiences = reviewer, audiences
        self._ttl, self._clock = ttl, clock
        self._answers: dict[bytes, tuple[float, Answer]] = {}
        self._known: OrderedDict[bytes, None] = OrderedDict()
        self._pending: dict[bytes, asyncio.Future[Answer]] = {}
        self._unknown_busy = 0
        self._unknown = ThreadPoolExecutor(UNKNOWN_LANE, thread_name_prefix="review-unknown")
        self._known_pool = ThreadPoolExecutor(KNOWN_LANE, thread_name_prefix="review-known")

    async def who(self, token: str) -> Identity:
        """The caller; LeaseAPIError UNAUTHENTICATED for a bad token, UNAVAILABLE when
        the API server does not answer or the unknown lane is full. ``token`` is ASCII
        (``lease_api.bearer`` admits no other)."""
        key = hashlib.sha256(token.encode("ascii")).digest()
        cached = self._answers.get(key)
        if cached is not None and cached[0] > self._clock():
            return _unwrap(cached[1])
        pending = self._pending.get(key)
        if pending is None:
            pending = asyncio.ensure_future(self._review(key, token))
            self._pending[key] = pending
            pending.add_done_callback(lambda f: self._done(key, f))
        return _unwrap(await asyncio.shield(pending))

    def _done(self, key: bytes, review: asyncio.Future[Answer]) -> None:
        self._pending.pop(key, None)
        if not review.cancelled():
            review.exception()  # retrieved: every caller may have gone meanwhile

    async def _review(self, key: bytes, token: str) -> Answer:
        known = key in self._known
        if not known and self._unknown_busy >= UNKNOWN_LANE:
            raise LeaseAPIError(
                Code.UNAVAILABLE, "too many tokens under review", retry_after=BUSY_RETRY_S
            )
        loop = asyncio.get_running_loop()
        if not known:
            self._unknown_busy += 1
        try:
            answer: Answer = await loop.run_in_executor(
                self._known_pool if known else self._unknown,
                self._reviewer.review,
                token,
                self._audiences,
            )
        except LeaseAPIError as exc:
            if exc.code is not Code.UNAUTHENTICATED:
                raise  # the API server not answering: ask again next time
            answer = exc
        finally:
            if not known:
                self._unknown_busy -= 1
        self._remember(key, answer)
        return answer

    def _remember(self, key: bytes, answer: Answer) -> None:
        now = self._clock()
        if len(self._answers) >= REVIEW_CACHE:
            self._answers = {k: v for k, v in self._answers.items() if v[0] > now}
        if len(self._answers) < REVIEW_CACHE:
            self._answers[key] = (now + self._ttl, answer)
        if isinstance(answer, Identity):
            self._known[key] = None
            self._known.move_to_end(key)
            while len(self._known) > REVIEW_CACHE:
                self._known.popitem(last=False)


def _unwrap(answer: Answer) -> Identity:
    if isinstance(answer, LeaseAPIError):
        raise answer
    return answer
