"""Fault injection: rules that make matching Redfish requests misbehave.

A rule (JSON, as given to ``--faults FILE`` or the admin endpoint ``/admin/faults``)::

    {
      "kind": "status503",            # see KINDS
      "method": "POST",               # optional regex on the HTTP method (full match)
      "path": "/Actions/ComputerSystem\\.AddResourceBlock$",  # optional regex (search)
      "count": 2,                     # fire on the next N matching requests, or
      "probability": 0.3, "seed": 7,  # fire with this probability (seeded, reproducible)
      "latency": 1.5,                 # seconds, for kind "latency"
      "retry_after": 2                # seconds, for kind "status503"
    }

Kinds:

- ``latency``: wait ``latency`` seconds, then handle the request normally.
- ``status503``: 503 with ``Retry-After`` and Base ServiceTemporarilyUnavailable.
- ``status500``: 500 with Base InternalError.
- ``conflict409``: 409 with Base ResourceInUse.
- ``drop_before``: close the connection without answering and without applying anything.
- ``drop_after``: handle the request (apply the change), then close without answering.
- ``task_failure``: for a composition change (action or PATCH): accept it asynchronously
  (202 and a task, even when the service is synchronous) and end the task in
  ``Exception``; nothing is applied.

With neither ``count`` nor ``probability`` a rule fires on every matching request. Latency
rules add up; of the other kinds the first matching rule that fires decides.
"""

from __future__ import annotations

import itertools
import random
import re
from dataclasses import dataclass, field
from typing import Any

KINDS = (
    "latency",
    "status503",
    "status500",
    "conflict409",
    "drop_before",
    "drop_after",
    "task_failure",
)


class FaultError(ValueError):
    """A fault rule is not valid."""


@dataclass
class Rule:
    id: str
    kind: str
    method: re.Pattern[str] | None = None
    path: re.Pattern[str] | None = None
    count: int | None = None
    probability: float | None = None
    seed: int | None = None
    latency: float = 0.0
    retry_after: int = 1
    fired: int = 0
    _rng: random.Random = field(default_factory=random.Random, repr=False)

    def matches(self, method: str, path: str) -> bool:
        if self.method is not None and not self.method.fullmatch(method.upper()):
            return False
        return self.path is None or self.path.search(path) is not None

    @property
    def exhausted(self) -> bool:
        return self.count is not None and self.count <= 0

    def roll(self) -> bool:
        """Whether the rule fires for one matching request (consumes count or a draw)."""
        if self.count is not None:
            if self.count <= 0:
                return False
            self.count -= 1
        elif self.probability is not None and self._rng.random() >= self.probability:
            return False
        self.fired += 1
        return True

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "kind": self.kind, "fired": self.fired}
        if self.method is not None:
            out["method"] = self.method.pattern
        if self.path is not None:
            out["path"] = self.path.pattern
        if self.count is not None:
            out["count"] = self.count
        if self.probability is not None:
            out["probability"] = self.probability
            out["seed"] = self.seed
        if self.kind == "latency":
            out["latency"] = self.latency
        if self.kind == "status503":
            out["retry_after"] = self.retry_after
        return out


def _regex(raw: dict[str, Any], key: str) -> re.Pattern[str] | None:
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise FaultError(f"{key} must be a string (a regular expression)")
    try:
        return re.compile(value, re.IGNORECASE if key == "method" else 0)
    except re.error as exc:
        raise FaultError(f"{key}: {exc}") from exc


def parse_rule(raw: Any, rule_id: str) -> Rule:
    if not isinstance(raw, dict):
        raise FaultError("a fault rule must be a JSON object")
    unknown = set(raw) - {
        "id",
        "kind",
        "method",
        "path",
        "count",
        "probability",
        "seed",
        "latency",
        "retry_after",
        "fired",
    }
    if unknown:
        raise FaultError(f"unknown fields {sorted(unknown)}")
    kind = raw.get("kind")
    if kind not in KINDS:
        raise FaultError(f"kind must be one of {list(KINDS)}")
    rule = Rule(id=str(raw.get("id") or rule_id), kind=kind)
    rule.method = _regex(raw, "method")
    rule.path = _regex(raw, "path")
    count, prob = raw.get("count"), raw.get("probability")
    if count is not None and prob is not None:
        raise FaultError("give either count or probability, not both")
    if count is not None:
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise FaultError("count must be a non-negative integer")
        rule.count = count
    if prob is not None:
        if not isinstance(prob, int | float) or isinstance(prob, bool) or not 0 <= prob <= 1:
            raise FaultError("probability must be a number from 0 to 1")
        seed = raw.get("seed", 0)
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise FaultError("seed must be an integer")
        rule.probability, rule.seed = float(prob), seed
        rule._rng = random.Random(seed)
    latency = raw.get("latency", 0.0)
    if not isinstance(latency, int | float) or isinstance(latency, bool) or latency < 0:
        raise FaultError("latency must be a non-negative number of seconds")
    rule.latency = float(latency)
    if kind == "latency" and rule.latency == 0:
        raise FaultError("a latency rule needs latency > 0")
    retry = raw.get("retry_after", 1)
    if not isinstance(retry, int) or isinstance(retry, bool) or retry < 0:
        raise FaultError("retry_after must be a non-negative integer")
    rule.retry_after = retry
    return rule


@dataclass(frozen=True)
class Decision:
    latency: float = 0.0
    rule: Rule | None = None  # the non-latency rule that fired, if any


class Faults:
    """The rule set. Not thread-safe; the server calls it from its event loop only."""

    def __init__(self) -> None:
        self.rules: list[Rule] = []
        self._ids = itertools.count(1)

    def add(self, raw: Any) -> Rule:
        rule = parse_rule(raw, str(next(self._ids)))
        if any(r.id == rule.id for r in self.rules):
            raise FaultError(f"a rule with id {rule.id!r} exists")
        self.rules.append(rule)
        return rule

    def replace(self, raws: Any) -> list[Rule]:
        if not isinstance(raws, list):
            raise FaultError("rules must be a list")
        old, self.rules = self.rules, []
        try:
            return [self.add(r) for r in raws]
        except FaultError:
            self.rules = old
            raise

    def remove(self, rule_id: str) -> bool:
        before = len(self.rules)
        self.rules = [r for r in self.rules if r.id != rule_id]
        return len(self.rules) != before

    def clear(self) -> None:
        self.rules = []

    def decide(self, method: str, path: str, kinds: frozenset[str]) -> Decision:
        """Which of the rules of ``kinds`` fire for this request."""
        latency = 0.0
        chosen: Rule | None = None
        for rule in self.rules:
            if rule.kind not in kinds or not rule.matches(method, path):
                continue
            if rule.kind == "latency":
                if rule.roll():
                    latency += rule.latency
            elif chosen is None and rule.roll():
                chosen = rule
        return Decision(latency=latency, rule=chosen)

    def to_json(self) -> list[dict[str, Any]]:
        return [r.to_json() for r in self.rules]


REQUEST_KINDS = frozenset(KINDS) - {"task_failure"}
TASK_KINDS = frozenset({"task_failure"})
