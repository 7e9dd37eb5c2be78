"""A token bucket: a rate with a burst (per-lease invocation quotas, log throttles)."""

from __future__ import annotations

import time


class TokenBucket:
    def __init__(self, rate: float, burst: float) -> None:
        self.rate = rate
        self.burst = max(burst, 1.0)
        self.tokens = self.burst
        self.stamp = time.monotonic()

    def take(self, now: float | None = None) -> bool:
        """Spend one token if there is one. A rate of 0 or less means unlimited."""
        if self.rate <= 0:
            return True
        now = time.monotonic() if now is None else now
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False
