"""Kubernetes label syntax: keys, values and label selectors, as the API server reads them
(apimachinery's validation of qualified names and label values, and ``labels.Parse``).

Used where the suite takes a label it will write (migrate-cohdi copies CoHDI's labels) or a
selector it will act on (a vendor restart's ``podSelector``: the scaler deletes what it
matches, so a selector must name what it selects: `names_something`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

_NAME = r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)"
_NAME_RE = re.compile(_NAME)
_VALUE_RE = re.compile(f"({_NAME})?")
# A DNS subdomain (RFC 1123), as a label key's prefix, a DRA driver's name or an object's
# name must be; api.v1alpha1's schema pattern is this one, anchored.
DNS_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
DNS_SUBDOMAIN_RE = re.compile(DNS_SUBDOMAIN)
# One requirement of a selector: `!key`, `key`, `key op value`, `key in|notin (values)`.
# Tokens may be spaced as labels.Parse allows; keys and values are checked afterwards.
_WORD = r"[^\s=!,()<>]+"
_REQUIREMENT = re.compile(
    rf"\s*(?:!\s*(?P<absent>{_WORD})"
    rf"|(?P<key>{_WORD})\s*(?:(?P<op>==|=|!=)\s*(?P<value>{_WORD})?"
    rf"|\s(?P<setop>in|notin)\s*\((?P<values>[^()]*)\))?)\s*"
)

Operator = Literal["exists", "!", "=", "!=", "in", "notin"]


class LabelError(ValueError):
    """A label key, value or selector the API server would refuse."""


@dataclass(frozen=True)
class Requirement:
    key: str
    op: Operator
    values: tuple[str, ...] = ()


def key_problem(key: str) -> str | None:
    """Why ``key`` is not a label key (None: it is one): ``[prefix/]name``, the prefix a
    DNS subdomain of at most 253 characters, the name at most 63."""
    prefix, _, name = key.rpartition("/")
    if "/" in key and not (
        prefix and len(prefix) <= 253 and DNS_SUBDOMAIN_RE.fullmatch(prefix) is not None
    ):
        return f"label key {key!r}: its prefix must be a DNS subdomain of at most 253 characters"
    if not (len(name) <= 63 and _NAME_RE.fullmatch(name)):
        return (
            f"label key {key!r}: its name must be 1 to 63 letters, digits, '-', '_' or '.', "
            "beginning and ending with a letter or digit"
        )
    return None


def value_problem(value: str) -> str | None:
    """Why ``value`` is not a label value (None: it is one)."""
    if len(value) <= 63 and _VALUE_RE.fullmatch(value):
        return None
    return (
        f"label value {value!r}: at most 63 letters, digits, '-', '_' or '.', beginning and "
        "ending with a letter or digit"
    )


def _split(selector: str) -> list[str]:
    """The requirements of ``selector``: split at the commas outside parentheses."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(selector):
        depth += {"(": 1, ")": -1}.get(c, 0)
        if c == "," and depth == 0:
            parts.append(selector[start:i])
            start = i + 1
    parts.append(selector[start:])
    return parts


def _requirement(text: str) -> Requirement:
    m = _REQUIREMENT.fullmatch(text)
    if m is None:
        raise LabelError(f"{text.strip()!r} is not a label requirement")
    if m["absent"] is not None:
        req = Requirement(m["absent"], "!")
    elif m["op"] is not None:
        op: Operator = "!=" if m["op"] == "!=" else "="
        req = Requirement(m["key"], op, (m["value"] or "",))
    elif m["setop"] is not None:
        values = tuple(v.strip() for v in m["values"].split(","))
        if "" in values:
            raise LabelError(f"{text.strip()!r}: a set of values has an empty member")
        req = Requirement(m["key"], "in" if m["setop"] == "in" else "notin", values)
    else:
        req = Requirement(m["key"], "exists")
    problems = [key_problem(req.key), *(value_problem(v) for v in req.values)]
    if found := [p for p in problems if p]:
        raise LabelError("; ".join(found))
    return req


def parse_selector(selector: str) -> list[Requirement]:
    """A label selector's requirements, or LabelError. The empty selector, which matches
    everything, has none."""
    if not selector.strip():
        return []
    return [_requirement(part) for part in _split(selector)]


def names_something(requirements: list[Requirement]) -> bool:
    """Whether a selector selects only objects labelled with a value it names: at least one
    ``key=value`` with a value. ``!x``, ``x``, ``a!=b`` and ``notin`` alone match objects
    that merely lack a label, such as every pod in a namespace."""
    return any(r.op == "=" and r.values[0] for r in requirements)
