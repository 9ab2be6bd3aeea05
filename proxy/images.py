"""Image content parts in a call: Chat Completions' ``image_url``, Responses' ``input_image``,
Anthropic Messages' ``image`` blocks (also inside a tool result).

Each dialect's image part becomes one canonical part, :func:`image_part`::

    {"type": "image", "media_type": "image/png", "data": BASE64, "sha256": HEX}

and a message's content with an image in it is a list of text and image parts (without one it
stays a string, as before). Images come inline (a base64 data URL, or Messages' ``base64``
source): the proxy fetches no URL (``image_url_not_supported``), and an undecodable or
non-image payload is a 400 ``invalid_image``, in the caller's dialect.

A call with an image goes to the engine's chat endpoint (:mod:`proxy.upstream_chat`), which
renders and tokenizes the prompt with the model's processor (the proxy's token-in path carries
no pixels); :func:`upstream_messages` writes the canonical messages in that endpoint's form.
The recorded body keeps a reference in place of each image's bytes (:func:`recorded_body`),
the bytes themselves stored once by content hash (:class:`infra.image_store.ImageStore`).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterator
from typing import Any

from infra.image_store import SUFFIXES, ImageStore, digest, ref
from proxy.canonical import Message, text_of
from proxy.errors import ProxyError

IMAGE_PARTS = frozenset({"image_url", "input_image", "image"})
_MAX_DEPTH = 8  # parts nest in tool results; deeper is not a content part

Part = dict[str, Any]


def _source(part: Part) -> str | tuple[str, str] | None:
    """A dialect's image part as a data URL, or Messages' (media type, base64) pair; None if
    it names no image at all."""
    kind = part.get("type")
    if kind == "image_url":  # Chat: {"image_url": {"url": ...}} (or the URL itself)
        inner = part.get("image_url")
        url = inner.get("url") if isinstance(inner, dict) else inner
        return url if isinstance(url, str) else None
    if kind == "input_image":  # Responses: {"image_url": "data:..."} or {"file_id": ...}
        url = part.get("image_url")
        return url if isinstance(url, str) else None
    source = part.get("source")  # Messages: {"source": {"type": "base64" | "url", ...}}
    if not isinstance(source, dict):
        return None
    if source.get("type") == "base64":
        return str(source.get("media_type", "")), str(source.get("data", ""))
    url = source.get("url")
    return url if isinstance(url, str) else None


def _split_data_url(url: str, where: str, param: str) -> tuple[str, str]:
    """A data URL's media type and base64 payload; 400 for any other URL."""
    head, comma, payload = url.partition(",")
    if not url.startswith("data:") or not comma or not head.endswith(";base64"):
        raise ProxyError(
            400,
            f"{where} is an image by URL ({url[:60]!r}): OpenForge's proxy fetches no URL; send "
            "the image inline as a base64 data URL (data:image/png;base64,...)",
            param=param,
            code="image_url_not_supported",
        )
    return head[5 : -len(";base64")], payload


def image_part(part: Part, where: str, param: str) -> Part:
    """The canonical form of a dialect's image part (see the module docstring)."""
    source = _source(part)
    if source is None:
        raise ProxyError(
            400,
            f"{where} is an image without inline data: send it as a base64 data URL "
            "(uploaded files are not supported)",
            param=param,
            code="image_url_not_supported",
        )
    media_type, payload = (
        source if isinstance(source, tuple) else _split_data_url(source, where, param)
    )
    if media_type not in SUFFIXES:
        raise ProxyError(
            400,
            f"{where} has media type {media_type!r}: send one of {sorted(SUFFIXES)}",
            param=param,
            code="invalid_image",
        )
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        data = b""
    if not data:
        raise ProxyError(
            400, f"{where} is not valid base64 image data", param=param, code="invalid_image"
        )
    return {"type": "image", "media_type": media_type, "data": payload, "sha256": digest(data)}


def content(value: Any, where: str, param: str) -> str | list[Part]:
    """A message's content in canonical form: its text (a string, as before) when it holds no
    image, else its text and image parts in order (adjacent text merged)."""
    if not isinstance(value, list) or not any(
        isinstance(p, dict) and p.get("type") in IMAGE_PARTS for p in value
    ):
        return text_of(value)
    parts: list[Part] = []
    for n, part in enumerate(value):
        if isinstance(part, dict) and part.get("type") in IMAGE_PARTS:
            parts.append(image_part(part, f"{where}[{n}]", param))
            continue
        text = text_of([part])
        if not text:
            continue
        if parts and parts[-1]["type"] == "text":
            parts[-1] = {"type": "text", "text": parts[-1]["text"] + text}
        else:
            parts.append({"type": "text", "text": text})
    return parts


def images(messages: list[Message]) -> Iterator[Part]:
    """The image parts of ``messages``, in prompt order."""
    for message in messages:
        value = message.get("content")
        if isinstance(value, list):
            yield from (p for p in value if isinstance(p, dict) and p.get("type") == "image")


def has_images(messages: list[Message]) -> bool:
    return next(images(messages), None) is not None


def image_ids(messages: list[Message]) -> list[str]:
    """The content hash of each image in ``messages``, in prompt order."""
    return [p["sha256"] for p in images(messages)]


def _upstream_part(part: Part) -> Part:
    if part["type"] == "image":
        url = f"data:{part['media_type']};base64,{part['data']}"
        return {"type": "image_url", "image_url": {"url": url}}
    return part


def upstream_messages(messages: list[Message]) -> list[Message]:
    """The canonical messages in the engine's chat form (images as data URLs)."""
    out = []
    for message in messages:
        value = message.get("content")
        if isinstance(value, list):
            message = {**message, "content": [_upstream_part(p) for p in value]}
        out.append(message)
    return out


def recorded_body(body: Any, store: ImageStore, depth: int = 0) -> Any:
    """``body`` with each image's bytes stored in ``store`` and replaced by their reference
    (in place of the data URL, or of Messages' ``data``); everything else as it came. The
    body was parsed already, so each image in it is valid."""
    if depth > 2 * _MAX_DEPTH + 4:
        return body
    if isinstance(body, list):
        return [recorded_body(item, store, depth + 1) for item in body]
    if not isinstance(body, dict):
        return body
    out = {k: recorded_body(v, store, depth + 1) for k, v in body.items()}
    if body.get("type") not in IMAGE_PARTS:
        return out
    source = _source(body)
    if source is None:
        return out
    media_type, payload = (
        source if isinstance(source, tuple) else _split_data_url(source, "image", "")
    )
    sha, _ = store.put(base64.b64decode(payload), media_type)
    if body["type"] == "image":
        out["source"] = {**body["source"], "data": ref(sha)}
    elif body["type"] == "input_image":
        out["image_url"] = ref(sha)
    elif isinstance(body.get("image_url"), dict):
        out["image_url"] = {**body["image_url"], "url": ref(sha)}
    else:
        out["image_url"] = ref(sha)
    return out
