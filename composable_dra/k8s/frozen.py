"""Read-only JSON for shared caches: a dict and a list that refuse to change.

An Informer hands every reader the objects it caches, without copying them (a copy per
read made each controller pass cost O(cluster)). A reader that changed one would change
every other reader's view, so the cache holds frozen objects: each is still a ``dict`` or
``list`` (JSON encoders, pydantic and ``==`` take them as they are), any change raises
``ReadOnlyError``, and ``copy.deepcopy`` gives back plain, changeable dicts and lists.
"""

from __future__ import annotations

from typing import Any, NoReturn


class ReadOnlyError(TypeError):
    """A cached object was changed in place: ``copy.deepcopy`` it first."""


def _refuse(self: object, *_args: object, **_kwargs: object) -> NoReturn:
    raise ReadOnlyError(f"cached {type(self).__name__} is read-only: copy.deepcopy it to change it")


class FrozenDict(dict[str, Any]):
    __slots__ = ()
    __setitem__ = __delitem__ = __ior__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse

    def __copy__(self) -> dict[str, Any]:
        return dict(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[str, Any]:
        plain: dict[str, Any] = thaw(self)
        return plain


class FrozenList(list[Any]):
    __slots__ = ()
    __setitem__ = __delitem__ = __iadd__ = __imul__ = _refuse
    append = extend = insert = pop = remove = clear = sort = reverse = _refuse

    def __copy__(self) -> list[Any]:
        return list(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> list[Any]:
        plain: list[Any] = thaw(self)
        return plain


def freeze(value: Any) -> Any:
    """``value`` (decoded JSON) as frozen dicts and lists, all the way down."""
    if isinstance(value, dict):
        return FrozenDict({k: freeze(v) for k, v in value.items()})
    if isinstance(value, list):
        return FrozenList(freeze(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    """A plain, changeable copy of ``value``."""
    if isinstance(value, dict):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, list):
        return [thaw(v) for v in value]
    return value
