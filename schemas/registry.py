"""One registry style for everything chosen by name: dialects, harnesses, trainer backends,
rollout backends.

A registry maps a name (usually a ``StrEnum`` member) to an entry, often a factory that imports
its heavy dependencies only when called. Looking up a name that is not there raises
:class:`~schemas.errors.ConfigError` listing the valid names. It lives here, beside the error
hierarchy, because every package may depend on ``schemas``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from enum import StrEnum
from typing import Generic, TypeVar

from schemas.errors import ConfigError

V = TypeVar("V")
E = TypeVar("E", bound=StrEnum)


def one_of(names: Iterable[str], last: str = "or") -> str:
    """``names`` as a sentence's list: ``"a, b or c"`` (help texts and errors take the names
    from the registry or enum that defines them, never by hand)."""
    items = [str(getattr(n, "value", n)) for n in names]
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} {last} {items[-1]}"


def choose(modes: type[E], value: str, kind: str) -> E:
    """``value`` as a member of the mode enum ``modes``, or a ConfigError naming the choices
    (``kind`` is the word for it in the message, e.g. ``"stale policy"``)."""
    try:
        return modes(value)
    except ValueError:
        raise ConfigError(
            f"unknown {kind} {value!r}: choose one of {', '.join(m.value for m in modes)}"
        ) from None


class Registry(Generic[V]):
    """Entries of one ``kind`` (the word used in error messages, e.g. ``"trainer backend"``)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, V] = {}

    def add(self, name: str, entry: V) -> V:
        """Register ``entry`` as ``name``; a second entry under one name is a programming error."""
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is registered twice")
        self._entries[str(name)] = entry
        return entry

    def register(self, name: str) -> Callable[[V], V]:
        """Decorator form of :meth:`add`."""

        def deco(entry: V) -> V:
            return self.add(name, entry)

        return deco

    def get(self, name: str) -> V:
        """The entry called ``name``, or a ConfigError that lists the valid names."""
        try:
            return self._entries[str(name)]
        except KeyError:
            raise ConfigError(
                f"unknown {self.kind} {str(name)!r}: choose one of {', '.join(self.names())}"
            ) from None

    def __getitem__(self, name: str) -> V:
        return self.get(name)

    def names(self) -> list[str]:
        return sorted(self._entries)

    def listing(self, last: str = "or") -> str:
        """The names as a sentence's list (``"a, b or c"``), for help texts and errors."""
        return one_of(self.names(), last)

    def __contains__(self, name: object) -> bool:
        return str(name) in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)
