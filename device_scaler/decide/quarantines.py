"""Phase 5: quarantines that ran out."""

from __future__ import annotations

from collections.abc import Iterable

from composable_dra.k8s.kube import JSON
from composable_dra.k8s.timestamps import parse_time
from composable_dra.model.names import ANN_EXPIRES
from device_scaler.decide.actions import Action, Unquarantine
from device_scaler.decide.reading import meta_of


def expired_quarantines(rules: Iterable[JSON], now: float) -> list[Action]:
    out: list[Action] = []
    for rule in rules:
        expires = parse_time((meta_of(rule).get("annotations") or {}).get(ANN_EXPIRES))
        if expires is None or expires <= now:
            out.append(Unquarantine(meta_of(rule)["name"]))
    return out
