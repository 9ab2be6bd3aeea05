"""Image content parts in a call: Chat Completions' ``image_url``, Responses' ``input_image``,
Anthropic Messages' ``image`` blocks (also inside a ``tool_result``).

The proxy sends the engine token ids it rendered itself (the token-in path of
:mod:`proxy.render`), and that path has no way to carry pixels: a call with an image is refused
with a 400 in the caller's dialect (code ``images_not_supported``), naming where the image is,
instead of being answered as if the image were not there. Nothing is recorded of a refused call
(the caller was told it failed). A harness that can send the same observation as text (the
browser agent's ``--observation text``) is told to.
"""

from __future__ import annotations

from typing import Any

from proxy.errors import ProxyError

IMAGE_PARTS = frozenset({"image_url", "input_image", "image"})
_MAX_DEPTH = 8  # parts nest in tool results; deeper is not a content part


def find_image(content: Any, where: str, depth: int = 0) -> str | None:
    """The path of the first image part in ``content`` (``where`` is its own), or None."""
    if depth > _MAX_DEPTH or not isinstance(content, list):
        return None
    for n, part in enumerate(content):
        if not isinstance(part, dict):
            continue
        here = f"{where}[{n}]"
        if part.get("type") in IMAGE_PARTS:
            return here
        found = find_image(part.get("content"), f"{here}.content", depth + 1)
        if found is not None:
            return found
    return None


def refuse_images(content: Any, where: str, param: str) -> None:
    """Raise the 400 for an image part in ``content``; nothing if there is none."""
    found = find_image(content, where)
    if found is not None:
        raise ProxyError(
            400,
            f"{found} is an image: the served model gets text only through OpenForge's proxy "
            "(its token-in path to the engine carries no images). Send the observation as "
            "text instead (the browser agent: --observation text).",
            param=param,
            code="images_not_supported",
        )
