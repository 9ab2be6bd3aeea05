"""The dialects the proxy speaks, by name (:class:`schemas.enums.Dialect`).

To add a dialect: write its module (a :class:`~proxy.dialects.base.Dialect`), add its name to
``schemas.enums.Dialect`` and one line here. Looking up a name that is not registered raises a
:class:`~schemas.errors.ConfigError` listing the valid ones.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from proxy.dialects import chat, messages, responses
from proxy.dialects.base import Dialect
from schemas import enums
from schemas.registry import Registry

DIALECTS: Registry[Dialect] = Registry("dialect")
DIALECTS.add(enums.Dialect.CHAT, chat.DIALECT)
DIALECTS.add(enums.Dialect.RESPONSES, responses.DIALECT)
DIALECTS.add(enums.Dialect.MESSAGES, messages.DIALECT)


def dialects() -> Iterator[Dialect]:
    """Every registered dialect, in name order."""
    return (DIALECTS.get(name) for name in DIALECTS)


def dialect_for(path: str, headers: Mapping[str, str]) -> Dialect:
    """The dialect of a request to a shared route (model list, admin): the first that
    recognizes it, else Chat Completions (whose error shape most clients parse)."""
    return next(
        (d for d in dialects() if d.recognizes(path, headers)), DIALECTS.get(enums.Dialect.CHAT)
    )
