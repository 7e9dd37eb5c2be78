"""Who called the lease API, as a TokenReview says, and which callers may do what.

The plugin's proof is its pod's own service-account token (projected by the kubelet,
bound to the pod): the API server adds the pod's name and node to the TokenReview's user
extras, and under the Node authorizer and NodeRestriction only the kubelet of that node
(or an administrator) can have a token bound to a pod there. The plugins' service account
may not create tokens, so a node cannot prove itself another node (docs/architecture.md,
"Leases: the control path").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from composable_dra.lending.remote_leases import (
    NODE_NAME_EXTRA,
    POD_NAME_EXTRA,
    Code,
    LeaseAPIError,
)


@dataclass(frozen=True)
class Identity:
    """The user a token authenticates as; the node and pod it is bound to, if any."""

    user: str
    node: str | None = None
    pod: str | None = None


def _one(extra: dict[str, Any], key: str) -> str | None:
    """The one string ``extra`` holds under ``key``; None for none, several or another type."""
    values = extra.get(key)
    if isinstance(values, list) and len(values) == 1 and isinstance(values[0], str):
        return values[0]
    return None


def identity_of(status: dict[str, Any], audiences: Sequence[str]) -> Identity:
    """The caller a TokenReview's status names; UNAUTHENTICATED unless it vouches for
    the token for one of ``audiences``."""
    if status.get("authenticated") is not True:
        raise LeaseAPIError(Code.UNAUTHENTICATED, "the token does not authenticate")
    granted = status.get("audiences")
    if not isinstance(granted, list) or not any(a in granted for a in audiences):
        raise LeaseAPIError(Code.UNAUTHENTICATED, "the token is for another audience")
    user = _dict(status.get("user"))
    extra = _dict(user.get("extra"))
    username = user.get("username")
    return Identity(
        username if isinstance(username, str) else "",
        _one(extra, NODE_NAME_EXTRA),
        _one(extra, POD_NAME_EXTRA),
    )


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def is_plugin_on(who: Identity, plugin: str, node: str) -> bool:
    """``who`` is the plugin of ``node``: the plugins' account, with a token bound to a pod
    on that node. A token bound to the Node object alone does not do: whoever may create
    the account's tokens can bind one to any Node, while only the node's kubelet can
    have one bound to a pod there."""
    return who.user == plugin and who.pod is not None and who.node == node


def service_account_user(namespace: str, name: str) -> str:
    return f"system:serviceaccount:{namespace}:{name}"
