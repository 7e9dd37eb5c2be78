"""Frames of a pipeline spread over its functional blocks, in flight bounded, results in order.

A block (a pod with a remote GPU) takes frames as it has room: at most ``bound`` of its
frames are unanswered at once, so a slow or stuck block holds no more than that, and the
others take the rest. Results come out in the order the frames went in (``ready``), a
frame whose block went away goes back to the head of the queue (``lost``), and a result
for a frame the block does not hold is refused, never counted twice.

``Dispatch`` is the decision, with no threads and no clock; ``Dispatcher`` is the same
behind a lock, with waits that end at a deadline.
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass, field
from typing import Generic, TypeVar

Frame = TypeVar("Frame")
Out = TypeVar("Out")


class NotHeld(LookupError):
    """A result for a frame the block does not hold (answered already, or never given)."""


@dataclass
class Dispatch(Generic[Frame, Out]):
    bound: int  # frames one block may hold unanswered
    queue: collections.deque[tuple[int, Frame]] = field(default_factory=collections.deque)
    held: dict[str, dict[int, Frame]] = field(default_factory=dict)
    answered: dict[int, Out] = field(default_factory=dict)
    submitted: int = 0  # the next frame's sequence number
    delivered: int = 0  # the next result ``ready`` gives

    def __post_init__(self) -> None:
        if self.bound < 1:
            raise ValueError("a block must be allowed at least one frame in flight")

    def submit(self, frame: Frame) -> int:
        seq = self.submitted
        self.queue.append((seq, frame))
        self.submitted += 1
        return seq

    def take(self, block: str) -> tuple[int, Frame] | None:
        """The oldest queued frame for ``block``; None when it is at its bound or none waits."""
        mine = self.held.setdefault(block, {})
        if len(mine) >= self.bound or not self.queue:
            return None
        seq, frame = self.queue.popleft()
        mine[seq] = frame
        return seq, frame

    def done(self, block: str, seq: int, result: Out) -> None:
        mine = self.held.get(block, {})
        if seq not in mine:
            raise NotHeld(f"block {block!r} holds no frame {seq}")
        del mine[seq]
        self.answered[seq] = result

    def lost(self, block: str) -> list[int]:
        """``block`` is gone: its unanswered frames go back to the head of the queue, oldest
        first. Returns their sequence numbers."""
        mine = self.held.pop(block, {})
        back = sorted(mine.items())
        self.queue.extendleft(reversed(back))
        return [seq for seq, _ in back]

    def ready(self) -> list[tuple[int, Out]]:
        """The results that are next in order, taken out."""
        out = []
        while self.delivered in self.answered:
            out.append((self.delivered, self.answered.pop(self.delivered)))
            self.delivered += 1
        return out

    @property
    def depth(self) -> int:
        """Frames waiting for a block."""
        return len(self.queue)

    def in_flight(self, block: str) -> int:
        return len(self.held.get(block, {}))


class Dispatcher(Generic[Frame, Out]):
    """``Dispatch`` shared by threads: blocks wait for a frame, the caller for results."""

    def __init__(self, bound: int) -> None:
        self._d: Dispatch[Frame, Out] = Dispatch(bound)
        self._changed = threading.Condition()

    def submit(self, frame: Frame) -> int:
        with self._changed:
            seq = self._d.submit(frame)
            self._changed.notify_all()
            return seq

    def take(self, block: str, timeout: float) -> tuple[int, Frame] | None:
        """A frame for ``block``, waiting up to ``timeout`` for one it may take."""
        with self._changed:
            got: list[tuple[int, Frame] | None] = [None]

            def taken() -> bool:
                got[0] = self._d.take(block)
                return got[0] is not None

            self._changed.wait_for(taken, timeout)
            return got[0]

    def done(self, block: str, seq: int, result: Out) -> None:
        with self._changed:
            self._d.done(block, seq, result)
            self._changed.notify_all()

    def lost(self, block: str) -> list[int]:
        with self._changed:
            back = self._d.lost(block)
            self._changed.notify_all()
            return back

    def ready(self, timeout: float) -> list[tuple[int, Out]]:
        """The results next in order, waiting up to ``timeout`` for at least one."""
        with self._changed:
            out: list[tuple[int, Out]] = []

            def some() -> bool:
                out.extend(self._d.ready())
                return bool(out)

            self._changed.wait_for(some, timeout)
            return out

    @property
    def depth(self) -> int:
        with self._changed:
            return self._d.depth
