"""Redaction: secrets removed from the text the proxy records, before it is published.

A :class:`Redactor` holds named patterns (regular expressions; the defaults in
:data:`DEFAULT_PATTERNS` cover API keys, bearer tokens, PEM private keys, e-mail addresses and the
proxy's own keys) and literal secrets (the admin token, and per rollout its own key). It replaces
every match in a string by ``[REDACTED:NAME]``; a pattern with a group named ``secret`` replaces
only that group (``Bearer [REDACTED:bearer_token]``). JSON values are redacted string by string
(object keys too), so a redacted body is still valid JSON of the same shape.

What is redacted (:mod:`proxy.recording`): a completion event's request and response bodies,
``model``, ``error`` and stop strings; a rollout event's ``message`` and metadata values; a reward
event's ``verifier_output``. What is never changed: token ids,
logprobs and policy-version spans. **Token ids are the training data**: a secret that was in a
prompt is still in ``prompt_token_ids`` (decoding them with the tokenizer gives it back), and one
the model generated is in ``completion_token_ids``. Redaction keeps secrets out of the text a
person or a query reads; it does not make a rollout safe to publish. Keep secrets out of the
rollout, or register it with ``"record": false`` (nothing of it is published).

Strings are redacted once and remembered (an LRU keyed by the text, bounded in entries and
characters): harnesses resend the same system prompt, tool schemas and history every call, so
the per-call cost stays with the new text. A default pattern's expression runs only on text
that holds one of its literal needles (``sk-``, ``@``, ``bearer``, ...).
"""

from __future__ import annotations

import re
from collections import Counter, OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import orjson

from schemas.errors import ConfigError


class RedactionMode(StrEnum):
    """What the proxy does with recorded text that matches a redaction pattern."""

    MASK = "mask"  # replace each match by [REDACTED:NAME]
    OFF = "off"  # record text as it came (token ids are never changed in either mode)


@dataclass(frozen=True, slots=True)
class RedactionPattern:
    """A named regular expression; a group named ``secret`` limits what is replaced.

    ``needles``: lower-case strings of which every match contains one; the expression runs only
    on text whose lower-case form holds one of them, so most text costs a substring search
    instead of the expression. Empty: it always runs (user patterns)."""

    name: str
    regex: re.Pattern[str]
    needles: tuple[str, ...] = ()

    def may_match(self, lowered: str) -> bool:
        return not self.needles or any(n in lowered for n in self.needles)

    @classmethod
    def compile(cls, name: str, pattern: str, needles: tuple[str, ...] = ()) -> RedactionPattern:
        try:
            regex = re.compile(pattern)
        except re.error as exc:
            raise ConfigError(
                f"redaction pattern {name!r} is not a valid regular expression ({exc}): "
                f"{pattern!r}; fix it (Python re syntax) or leave it out"
            ) from None
        if regex.search("") is not None:
            raise ConfigError(
                f"redaction pattern {name!r} matches the empty string ({pattern!r}): it would "
                "redact everywhere; make it match the secret itself"
            )
        return cls(name, regex, needles)


# name -> regular expression. Prefixes are those the providers document for their keys.
DEFAULT_PATTERNS: dict[str, str] = {
    "private_key": (
        r"-----BEGIN[A-Z0-9 ]*PRIVATE KEY-----"
        r"(?:[\s\S]*?-----END[A-Z0-9 ]*PRIVATE KEY-----|[\s\S]*)"  # a cut-off key: to the end
    ),
    "api_key": (
        r"\b(?:sk-[A-Za-z0-9_\-]{16,}"  # OpenAI (sk-, sk-proj-), Anthropic (sk-ant-)
        r"|(?:AKIA|ASIA)[0-9A-Z]{16}"  # AWS access key ids
        r"|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"  # GitHub
        r"|xox[abposr]-[A-Za-z0-9\-]{10,}"  # Slack
        r"|AIza[0-9A-Za-z_\-]{35}"  # Google
        r"|hf_[A-Za-z0-9]{30,})"  # Hugging Face
    ),
    "rollout_key": r"\bofk_[A-Za-z0-9_\-]{20,}",  # keys this proxy mints (any rollout's)
    "bearer_token": r"(?ai)\bbearer\s+(?P<secret>[A-Za-z0-9\-._~+/]{8,}=*)",
    # The local part starts where a run of its characters starts, and is taken whole (possessive):
    # linear in the text, where a plain [..]+@ is quadratic on a long run without an "@".
    "email": (
        r"(?<![A-Za-z0-9._%+\-])[A-Za-z0-9._%+\-]++@"
        r"[A-Za-z0-9\-]+(?:\.[A-Za-z0-9\-]+)*\.[A-Za-z]{2,}"
    ),
    "secret_assignment": (
        r"(?ai)(?:api[_-]?key|secret|token|passw(?:or)?d)[\"']?\s*[:=]\s*[\"']?"
        r"(?P<secret>[A-Za-z0-9_\-./+=]{8,})"
    ),
}

# What every match of a default pattern contains, lower-cased (see RedactionPattern.needles).
NEEDLES: dict[str, tuple[str, ...]] = {
    "private_key": ("-----begin",),
    "api_key": (
        "sk-",
        "akia",
        "asia",
        "ghp_",
        "gho_",
        "ghu_",
        "ghs_",
        "ghr_",
        "github_pat_",
        "xox",
        "aiza",
        "hf_",
    ),
    "rollout_key": ("ofk_",),
    "bearer_token": ("bearer",),
    "secret_assignment": ("key", "secret", "token", "passw", "passwd"),
    "email": ("@",),
}

LITERAL = "secret"  # the counter label of literal secrets (admin token, a rollout's key)
CACHE_ENTRIES = 8192  # strings remembered once redacted (harnesses resend the same ones)
CACHE_CHARS = 8_000_000  # and at most this many characters of them in all
MIN_SECRET = 6  # no default pattern matches a shorter string ("a@b.cd")
FIELD_VARIANTS = 8  # redacted values remembered per top-level body field (tools, system, ...)


def read_pattern_file(path: Path) -> list[str]:
    """Patterns from a file: one regular expression a line; blank lines and ``#`` lines skipped."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ConfigError(f"cannot read the redaction pattern file {path}: {exc}") from None
    return [line for line in lines if line.strip() and not line.lstrip().startswith("#")]


def build_patterns(
    extra: Sequence[str] = (), *, defaults: bool = True, names: Iterable[str] | None = None
) -> list[RedactionPattern]:
    """The default patterns (``names`` picks some; None: all) and ``extra`` ones, compiled
    (named ``custom_1``, ``custom_2``, ...); a bad pattern raises ConfigError."""
    chosen = list(DEFAULT_PATTERNS) if names is None else list(names)
    unknown = [n for n in chosen if n not in DEFAULT_PATTERNS]
    if unknown:
        raise ConfigError(
            f"unknown default redaction pattern {unknown[0]!r}: choose from "
            f"{', '.join(DEFAULT_PATTERNS)}"
        )
    out = (
        [RedactionPattern.compile(n, DEFAULT_PATTERNS[n], NEEDLES[n]) for n in chosen]
        if defaults
        else []
    )
    out += [RedactionPattern.compile(f"custom_{i}", p) for i, p in enumerate(extra, 1)]
    return out


def placeholder(name: str) -> str:
    return f"[REDACTED:{name}]"


class Redactor:
    """Removes secrets from text and JSON values; counts what it removed, by pattern name.

    ``counts`` is a running Counter the caller may read and reset (the proxy adds it to
    ``openforge_proxy_redactions``). Not thread-safe: use it from the event loop.
    """

    def __init__(self, patterns: Sequence[RedactionPattern], literals: Iterable[str] = ()) -> None:
        self.patterns = list(patterns)
        self.literals = sorted({s for s in literals if s}, key=len, reverse=True)
        self.counts: Counter[str] = Counter()
        self._cache: OrderedDict[str, tuple[str, Counter[str]]] = OrderedDict()
        self._cached_chars = 0
        self._fields: dict[str, list[tuple[bytes, Any, Counter[str]]]] = {}
        defaults_only = all(p.needles for p in self.patterns)
        self._shortest = MIN_SECRET if defaults_only and self.patterns else 1

    @property
    def active(self) -> bool:
        return bool(self.patterns or self.literals)

    def text(self, value: str, literals: Sequence[str] = ()) -> str:
        """``value`` with every literal secret (the redactor's and ``literals``) and every
        pattern match replaced by its placeholder."""
        for secret in (*self.literals, *literals):
            if secret and secret in value:
                self.counts[LITERAL] += value.count(secret)
                value = value.replace(secret, placeholder(LITERAL))
        if len(value) < self._shortest:
            return value
        hit = self._cache.get(value)
        if hit is None:
            found: Counter[str] = Counter()
            hit = (self._patterns(value, found), found)
            self._cache[value] = hit
            self._cached_chars += len(value)
            while len(self._cache) > CACHE_ENTRIES or self._cached_chars > CACHE_CHARS:
                old, _ = self._cache.popitem(last=False)
                self._cached_chars -= len(old)
        else:
            self._cache.move_to_end(value)
        if hit[1]:
            self.counts.update(hit[1])
        return hit[0]

    def _patterns(self, value: str, counts: Counter[str]) -> str:
        lowered = value.lower()
        for pattern in self.patterns:
            if not pattern.may_match(lowered) or pattern.regex.search(value) is None:
                continue
            value = pattern.regex.sub(_replacer(pattern.name, counts), value)
            lowered = value.lower()
        return value

    def body(
        self, body: dict[str, Any], literals: Sequence[str] = (), fresh: str | None = None
    ) -> dict[str, Any]:
        """:meth:`json` of a request body, remembering the redacted value of each top-level
        field: a harness resends the same tools and system prompt every call, and walking them
        again would make each call's cost grow with their size. A remembered value is reused
        when the field serialises to the same bytes as the one it came from and none of
        ``literals`` (the caller's own secrets, which differ per rollout) occurs in them.
        ``fresh`` names a field that is new every call (the history's new items): walked, not
        remembered."""
        out: dict[str, Any] = {}
        for key, value in body.items():
            name = self.text(key, literals)
            remember = key != fresh and isinstance(value, dict | list) and value
            try:
                text = orjson.dumps(value) if remember else None
            except TypeError:  # what orjson does not take (an integer past 64 bits)
                text = None
            if text is None or any(s.encode() in text for s in literals):
                out[name] = self.json(value, literals)
                continue
            variants = self._fields.setdefault(name, [])
            hit = next((v for v in variants if v[0] == text), None)
            if hit is not None:
                self.counts.update(hit[2])
                out[name] = hit[1]
                continue
            before = self.counts.copy()
            out[name] = self.json(value, literals)
            variants.insert(0, (text, out[name], self.counts - before))
            del variants[FIELD_VARIANTS:]
        return out

    def json(self, value: Any, literals: Sequence[str] = ()) -> Any:
        """A JSON value with every string (object keys too) redacted; same shape, and values
        that are not strings unchanged. Iterative: a deep body does not recurse."""
        if isinstance(value, str):
            return self.text(value, literals)
        if not isinstance(value, dict | list):
            return value
        root: list[Any] = [None]
        stack: list[tuple[Any, Any, Any]] = [(value, root, 0)]  # (source, parent, slot)
        while stack:
            source, parent, slot = stack.pop()
            if isinstance(source, str):
                parent[slot] = self.text(source, literals)
            elif isinstance(source, dict):
                out: dict[str, Any] = {}
                parent[slot] = out
                for k, v in source.items():
                    key = self.text(k, literals) if isinstance(k, str) else k
                    out[key] = None
                    stack.append((v, out, key))
            elif isinstance(source, list):
                items: list[Any] = [None] * len(source)
                parent[slot] = items
                stack.extend((v, items, i) for i, v in enumerate(source))
            else:
                parent[slot] = source
        return root[0]


def _replacer(name: str, counts: Counter[str]) -> Any:
    mark = placeholder(name)

    def replace(match: re.Match[str]) -> str:
        counts[name] += 1
        if "secret" in match.re.groupindex and match.group("secret") is not None:
            start, end = match.span("secret")
            whole = match.group(0)
            offset = match.start()
            return whole[: start - offset] + mark + whole[end - offset :]
        return mark

    return replace
