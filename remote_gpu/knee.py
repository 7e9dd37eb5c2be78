"""Where scaling a pipeline out over remote GPUs stops paying: the link's knee.

A pipeline stage sends each frame (``frame_bytes`` both ways over the donors' shared
link) to one of ``n`` remote GPUs, each taking ``compute_s`` per frame. With enough calls
in flight per GPU to hide the transfer, ``n`` GPUs deliver ``n / compute_s`` frames/s
until the link carries no more: ``link_bytes_per_s / frame_bytes``. The knee is the first
count whose demand the link cannot carry (``n x per-GPU FPS > link FPS``); from there on
another GPU adds nothing. The same rule reads a measured curve: its plateau (the best
FPS) over its one-GPU FPS.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class LinkModel:
    """The model's inputs, each measured before a sweep."""

    frame_bytes: float  # bytes one frame puts on the link (request and result)
    compute_s: float  # one GPU's time per frame
    link_bytes_per_s: float  # what the shared link carries

    def __post_init__(self) -> None:
        if min(self.frame_bytes, self.compute_s, self.link_bytes_per_s) <= 0:
            raise ValueError(f"every input of the knee model must be positive: {self}")

    @property
    def per_gpu_fps(self) -> float:
        return 1.0 / self.compute_s

    @property
    def link_fps(self) -> float:
        return self.link_bytes_per_s / self.frame_bytes

    def fps(self, count: int) -> float:
        """Frames/s the model expects from ``count`` GPUs."""
        return min(count * self.per_gpu_fps, self.link_fps)


def knee(per_gpu_fps: float, ceiling_fps: float, most: int) -> int | None:
    """The first count in 1..``most`` whose demand passes ``ceiling_fps``; None when the
    ceiling is not reached within ``most``."""
    for n in range(1, most + 1):
        if n * per_gpu_fps > ceiling_fps:
            return n
    return None


def predicted_knee(model: LinkModel, most: int) -> int | None:
    return knee(model.per_gpu_fps, model.link_fps, most)


def measured_knee(fps_by_count: Mapping[int, float]) -> int | None:
    """The knee of a measured sweep (counts from 1, every count): the plateau is the best
    FPS measured, the per-GPU rate the FPS at one GPU. A link that one GPU already fills
    shows no slope, so a sweep sees a knee from 2 on."""
    if 1 not in fps_by_count or fps_by_count[1] <= 0:
        raise ValueError("a sweep's knee needs its FPS at one GPU")
    counts = sorted(fps_by_count)
    if counts != list(range(1, len(counts) + 1)):
        raise ValueError(f"a sweep measures every count from 1: got {counts}")
    return knee(fps_by_count[1], max(fps_by_count.values()), counts[-1])
