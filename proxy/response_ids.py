"""Response ids that name their rollout, so feedback can come by response id.

A harness (or the person behind it) may hold nothing but the id of the answer it got: a chat
completion's ``chatcmpl-...``, a response's ``resp_...``, a message's ``msg_...``. Each id the
proxy answers with is the dialect's prefix, the rollout id in lowercase base32 (no padding) and
16 random hex digits, so ``POST /responses/{id}/reward`` finds the rollout without any table,
any time later, on any worker (the pool's front decodes it too). The rollout id is no secret:
a reward still needs the admin or the feedback credential.
"""

from __future__ import annotations

import base64
import binascii
import secrets

PREFIXES = ("chatcmpl-", "resp_", "msg_")
_RANDOM = 16  # hex digits after the rollout id


def response_id(prefix: str, rollout_id: str) -> str:
    """A new response id of ``rollout_id`` with the dialect's ``prefix``."""
    name = base64.b32encode(rollout_id.encode()).decode().rstrip("=").lower()
    return f"{prefix}{name}{secrets.token_hex(_RANDOM // 2)}"


def rollout_of(response: str) -> str | None:
    """The rollout id inside ``response`` (an id :func:`response_id` made); None otherwise."""
    prefix = next((p for p in PREFIXES if response.startswith(p)), None)
    if prefix is None or len(response) <= len(prefix) + _RANDOM:
        return None
    name = response[len(prefix) : -_RANDOM].upper()
    try:
        decoded = base64.b32decode(name + "=" * (-len(name) % 8))
        return decoded.decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
