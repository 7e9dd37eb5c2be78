"""YAML from a user's file, read without aliases.

PyYAML's safe loader expands aliases: a few hundred bytes of anchors, each aliased nine
times by the next, build a graph whose traversal (validation, dumping) takes gigabytes.
Kubernetes objects as ``kubectl get -o yaml`` writes them never carry aliases, so a
document that has one is refused rather than expanded; without them the documents are no
larger than the text.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.nodes import Node


class _NoAliasLoader(yaml.SafeLoader):
    def compose_node(self, parent: Node | None, index: int) -> Node | None:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise ComposerError(
                None, None, "YAML aliases (*name) are not accepted", event.start_mark
            )
        return super().compose_node(parent, index)


def load_all(text: str) -> list[Any]:
    """Every document of ``text``; yaml.YAMLError when it is not YAML, has an alias, or
    nests deeper than the parser's recursion allows."""
    try:
        return list(yaml.load_all(text, Loader=_NoAliasLoader))
    except RecursionError:
        raise yaml.YAMLError("the YAML nests too deeply") from None
