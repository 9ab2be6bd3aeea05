"""Commands whose options are a dataclass: each field one option, declared once, with its type,
help and default; the command's body takes the filled-in dataclass.

    @dataclass(frozen=True)
    class ProxyOptions:
        upstream: Annotated[str, typer.Option(help="Model server base URL.")]
        port: Annotated[int, typer.Option(help="Port to bind.")] = 8100

    @options_command(ProxyOptions)
    def proxy(opts: ProxyOptions) -> None:
        serve(opts.upstream, opts.port)  # its docstring is the command's help

Typer reads the command's parameters from its signature, so the command it is given has one
keyword parameter per field (the field's annotation and default); the body is called with the
dataclass built from them. Options several commands share are one ``Annotated`` alias (or one
dataclass the commands' options include as fields), so their help says the same everywhere.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar, get_type_hints

T = TypeVar("T")


def options_command(options: type[T]) -> Callable[[Callable[[T], None]], Callable[..., None]]:
    """The Typer command of ``body(options)``: its parameters are ``options``' fields."""
    if not dataclasses.is_dataclass(options):
        raise TypeError(f"{options.__name__} is not a dataclass")
    hints = get_type_hints(options, include_extras=True)
    params = [
        inspect.Parameter(
            f.name, inspect.Parameter.KEYWORD_ONLY, default=_default(f), annotation=hints[f.name]
        )
        for f in dataclasses.fields(options)
    ]

    def wrap(body: Callable[[T], None]) -> Callable[..., None]:
        @functools.wraps(body)
        def command(**values: Any) -> None:
            body(options(**values))

        del command.__wrapped__  # Typer reads this signature, not the body's
        command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params} | {"return": None}
        return command

    return wrap


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return inspect.Parameter.empty
