"""OpenForge's browser agent: a model drives headless Chromium with tool calls.

    python -I browser_main.py --base-url URL --dialect chat|messages --model NAME --task-file F

It runs inside a rollout's sandbox with the standard library only (HTTP to the proxy with
``urllib``; Chromium over the DevTools pipe with ``browser_cdp.py``, copied beside it). The
loop: open the task's first ``http(s)`` URL (or ``--start-url``); show the model the page (the
accessibility tree as text, ``--observation text``; a screenshot, ``screenshot``; or both) with
the task; each tool call of the model is done in the browser: ``click``, ``type``, ``select``,
``scroll``, ``navigate`` (``http(s)`` only) and ``done``; the page after them goes back with
the tool results. It ends at ``done``, an answer without a tool call, the turn limit or the
deadline. Calls go through the proxy in the OpenAI Chat Completions dialect (``chat``:
screenshots as ``image_url`` data URLs in a user message) or Anthropic Messages (``messages``:
screenshots as ``image`` blocks in the tool results). The API key is read from
``$OPENFORGE_API_KEY``.

Output, one JSON object per line on stdout, as the built-in agent's: ``start``, ``step`` after
each answer, ``action`` after each tool call, ``error``, and last ``final`` (``stop`` is
``done``, ``answer``, ``max_turns``, ``deadline`` or ``error``; exit code 1 for ``error``).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING or __package__:  # imported as infra.harnesses.browser_main
    from infra.harnesses.browser_cdp import Browser, BrowserError, Page
else:  # run as a script in the sandbox: the copy beside it
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from browser_cdp import Browser, BrowserError, Page

API_KEY_ENV = "OPENFORGE_API_KEY"
ANTHROPIC_VERSION = "2023-06-01"

_ELEMENT = {"type": "integer", "description": "The element's number, as [N] in the page."}
TOOLS: list[dict[str, Any]] = [
    {
        "name": "click",
        "description": "Click an element (a button, link, checkbox, ...).",
        "parameters": {
            "type": "object",
            "properties": {"element": _ELEMENT},
            "required": ["element"],
        },
    },
    {
        "name": "type",
        "description": "Replace a text field's text; with submit, press Enter after it.",
        "parameters": {
            "type": "object",
            "properties": {
                "element": _ELEMENT,
                "text": {"type": "string"},
                "submit": {"type": "boolean", "description": "Press Enter after typing."},
            },
            "required": ["element", "text"],
        },
    },
    {
        "name": "select",
        "description": "Choose an option of a drop-down list, by its text.",
        "parameters": {
            "type": "object",
            "properties": {"element": _ELEMENT, "option": {"type": "string"}},
            "required": ["element", "option"],
        },
    },
    {
        "name": "scroll",
        "description": "Scroll the page down or up.",
        "parameters": {
            "type": "object",
            "properties": {"direction": {"type": "string", "enum": ["down", "up"]}},
            "required": ["direction"],
        },
    },
    {
        "name": "navigate",
        "description": "Open a URL (http or https).",
        "parameters": {
            "type": "object",
            "properties": {"url": {"type": "string"}},
            "required": ["url"],
        },
    },
    {
        "name": "done",
        "description": "Say the task is finished, with a short answer.",
        "parameters": {
            "type": "object",
            "properties": {"answer": {"type": "string"}},
            "required": ["answer"],
        },
    },
]

SYSTEM = """\
You control a web browser to do a task. After each step you are shown the page: its URL, title \
and elements; the ones you can act on are numbered, like [3] button "Save". Act with the tools: \
click, type (with submit to press Enter), select (a drop-down list's option), scroll, navigate, \
and done when the task is finished."""


def emit(kind: str, **fields: Any) -> None:
    print(json.dumps({"type": kind, **fields}), flush=True)


def act(page: Page, name: str, arguments: str) -> tuple[str, str | None]:
    """Do one tool call in the browser: (the tool result's text, the answer if it was done)."""
    try:
        args = json.loads(arguments or "{}")
    except ValueError:
        return "error: the arguments must be a JSON object", None
    if not isinstance(args, dict):
        return "error: the arguments must be a JSON object", None
    try:
        if name == "done":
            return "done", str(args.get("answer", ""))
        if name == "click":
            page.click(int(args["element"]))
        elif name == "type":
            page.type(int(args["element"]), str(args["text"]), bool(args.get("submit", False)))
        elif name == "select":
            page.select(int(args["element"]), str(args["option"]))
        elif name == "scroll":
            page.scroll(down=args.get("direction", "down") != "up")
        elif name == "navigate":
            page.goto(str(args["url"]))
        else:
            return f"error: unknown tool {name!r}; the tools are {[t['name'] for t in TOOLS]}", None
    except (KeyError, TypeError, ValueError) as exc:
        return f"error: missing or wrong argument ({exc})", None
    except BrowserError as exc:
        return f"error: {exc}", None
    return "ok", None


class Dialect:
    """How one API is spoken: the request, the answer's text and tool calls, the messages."""

    def __init__(self, name: str, base_url: str, model: str, max_tokens: int | None) -> None:
        self.name, self.base_url, self.model, self.max_tokens = name, base_url, model, max_tokens

    def request(self, system: str, messages: list[dict[str, Any]]) -> urllib.request.Request:
        key = os.environ.get(API_KEY_ENV) or "none"
        if self.name == "chat":
            body: dict[str, Any] = {
                "model": self.model,
                "messages": [{"role": "system", "content": system}, *messages],
                "tools": [{"type": "function", "function": t} for t in TOOLS],
            }
            if self.max_tokens:
                body["max_tokens"] = self.max_tokens
            headers = {"Authorization": f"Bearer {key}"}
            url = f"{self.base_url}/v1/chat/completions"
        else:
            body = {
                "model": self.model,
                "system": system,
                "messages": messages,
                "max_tokens": self.max_tokens or 1024,
                "tools": [
                    {
                        "name": t["name"],
                        "description": t["description"],
                        "input_schema": t["parameters"],
                    }
                    for t in TOOLS
                ],
            }
            headers = {"x-api-key": key, "anthropic-version": ANTHROPIC_VERSION}
            url = f"{self.base_url}/v1/messages"
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
        return urllib.request.Request(url, data=data, headers=headers, method="POST")

    def read(self, answer: dict[str, Any]) -> tuple[str, list[dict[str, str]], dict[str, Any]]:
        """(text, tool calls as {id, name, arguments}, the assistant message to resend)."""
        if self.name == "chat":
            message = answer["choices"][0]["message"]
            calls = [
                {
                    "id": c.get("id") or "",
                    "name": c["function"]["name"],
                    "arguments": c["function"].get("arguments") or "{}",
                }
                for c in message.get("tool_calls") or ()
            ]
            resend = {"role": "assistant", "content": message.get("content") or ""}
            if message.get("tool_calls"):
                resend["tool_calls"] = message["tool_calls"]
            return message.get("content") or "", calls, resend
        blocks = answer.get("content") or []
        text = "".join(b.get("text", "") for b in blocks if b.get("type") == "text")
        calls = [
            {"id": b["id"], "name": b["name"], "arguments": json.dumps(b.get("input") or {})}
            for b in blocks
            if b.get("type") == "tool_use"
        ]
        return text, calls, {"role": "assistant", "content": blocks}

    def results(
        self, calls: list[dict[str, str]], texts: list[str], page: str, png: bytes | None
    ) -> list[dict[str, Any]]:
        """The messages that answer ``calls``; the page after them goes with the last one."""
        texts = [*texts[:-1], f"{texts[-1]}\n\nThe page now:\n{page}"]
        if self.name == "chat":
            out: list[dict[str, Any]] = [
                {"role": "tool", "tool_call_id": c["id"], "content": t}
                for c, t in zip(calls, texts, strict=True)
            ]
            if png is not None:
                out.append({"role": "user", "content": _chat_parts("The page now:", png)})
            return out
        blocks: list[dict[str, Any]] = []
        for c, t in zip(calls, texts, strict=True):
            content: list[dict[str, Any]] = [{"type": "text", "text": t}]
            if png is not None and c is calls[-1]:
                content.append(_image_block(png))
            blocks.append({"type": "tool_result", "tool_use_id": c["id"], "content": content})
        return [{"role": "user", "content": blocks}]

    def first(self, task: str, page: str, png: bytes | None) -> dict[str, Any]:
        text = f"{task}\n\nThe page now:\n{page}"
        if png is None:
            return {"role": "user", "content": text}
        if self.name == "chat":
            return {"role": "user", "content": _chat_parts(text, png)}
        return {"role": "user", "content": [{"type": "text", "text": text}, _image_block(png)]}


def _chat_parts(text: str, png: bytes) -> list[dict[str, Any]]:
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    return [{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": url}}]


def _image_block(png: bytes) -> dict[str, Any]:
    data = base64.b64encode(png).decode()
    return {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}


def post(request: urllib.request.Request, timeout_s: float, retries: int) -> dict[str, Any]:
    """The JSON answer; a connection error or a 5xx is tried again up to ``retries`` times."""
    attempt = 0
    while True:
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                value = json.loads(response.read())
                return value if isinstance(value, dict) else {}
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:500]
            if exc.code < 500 or attempt >= retries:
                raise RuntimeError(f"HTTP {exc.code}: {detail}") from exc
        except (urllib.error.URLError, OSError, ValueError) as exc:
            if attempt >= retries:
                raise RuntimeError(f"{type(exc).__name__}: {exc}") from exc
        attempt += 1
        emit("error", message="the call failed; trying again", attempt=attempt, retrying=True)
        time.sleep(min(0.5 * 2 ** (attempt - 1), 4.0))


def look(page: Page, observation: str) -> tuple[str, bytes | None]:
    """The page as the model is shown it: text (or a line saying a screenshot follows), PNG."""
    text = page.observe().text if observation != "screenshot" else "(see the screenshot)"
    png = page.screenshot() if observation != "text" else None
    return text, png


def start_url(task: str, explicit: str | None) -> str:
    found = re.search(r"https?://[^\s)>\"'`]+", task)
    return explicit or (found.group(0).rstrip(".,;") if found else "about:blank")


class Turns:
    """The conversation with the model, one turn (a call and its tool calls done) at a time."""

    def __init__(self, args: argparse.Namespace, page: Page, task: str) -> None:
        self.args, self.page = args, page
        self.dialect = Dialect(args.dialect, args.base_url.rstrip("/"), args.model, args.max_tokens)
        self.deadline = time.monotonic() + args.time_limit
        self.messages = [self.dialect.first(task, *look(page, args.observation))]
        self.final: str | None = None

    def take(self, turn: int) -> str | None:
        """One turn; the reason to stop (``done``, ``answer``, ``error``), or None to go on."""
        try:
            request = self.dialect.request(SYSTEM, self.messages)
            answer = post(request, max(self.deadline - time.monotonic(), 1.0), self.args.retries)
            text, calls, resend = self.dialect.read(answer)
        except (RuntimeError, KeyError, IndexError, TypeError) as exc:
            emit("error", message=str(exc), retrying=False)
            return "error"
        for n, call in enumerate(calls):
            call["id"] = call["id"] or f"call_{turn}_{n}"
        emit("step", turn=turn, content=text, tool_calls=calls)
        self.final = text or self.final
        self.messages.append(resend)
        if not calls:
            return "answer"
        texts, done = [], None
        for call in calls:
            result, answered = act(self.page, call["name"], call["arguments"])
            emit("action", call_id=call["id"], name=call["name"], arguments=call["arguments"],
                 result=result)  # fmt: skip
            texts.append(result)
            done = answered if answered is not None else done
        if done is not None:
            self.final = done or self.final
            return "done"
        try:
            self.messages += self.dialect.results(
                calls, texts, *look(self.page, self.args.observation)
            )
        except BrowserError as exc:
            emit("error", message=f"the page cannot be read: {exc}", retrying=False)
            return "error"
        return None


def play(args: argparse.Namespace, page: Page, task: str) -> tuple[str, int, str | None]:
    """Open the start page, then take turns until a stop: (stop, turns, final message)."""
    url = start_url(task, args.start_url)
    try:
        if url != "about:blank":
            page.goto(url)
        turns = Turns(args, page, task)
    except BrowserError as exc:
        emit("error", message=f"cannot open {url}: {exc}", retrying=False)
        return "error", 0, None
    emit("observation", url=page.evaluate("location.href"))
    for turn in range(1, args.max_turns + 1):
        if turns.deadline - time.monotonic() <= 1:
            return "deadline", turn - 1, turns.final
        stop = turns.take(turn)
        if stop is not None:
            return stop, turn, turns.final
    return "max_turns", args.max_turns, turns.final


def run(args: argparse.Namespace) -> int:
    session_id = str(uuid.uuid4())
    task = Path(args.task_file).read_text(encoding="utf-8")
    emit("start", session_id=session_id, model=args.model, dialect=args.dialect)
    try:
        browser = Browser.launch(os.environ.get("HOME") or "/tmp", chromium=args.chromium)
    except BrowserError as exc:
        emit("error", message=f"Chromium did not start: {exc}", retrying=False)
        stop, turns, final = "error", 0, None
    else:
        with browser:
            stop, turns, final = play(args, browser.page, task)
    emit("final", final_message=final, session_id=session_id, stop=stop, turns=turns)
    return 1 if stop == "error" else 0


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--base-url", required=True, help="the proxy's base URL (without /v1)")
    p.add_argument("--dialect", choices=["chat", "messages"], default="chat")
    p.add_argument("--model", required=True)
    p.add_argument("--task-file", required=True, help="the task's instruction, as text")
    p.add_argument("--start-url", default=None, help="default: the task's first http(s) URL")
    p.add_argument("--observation", choices=["text", "screenshot", "both"], default="text")
    p.add_argument("--chromium", default=None, help="default: chromium on PATH")
    p.add_argument("--max-turns", type=int, default=8, help="model calls at most")
    p.add_argument("--time-limit", type=float, default=600.0, help="seconds for the whole run")
    p.add_argument("--max-tokens", type=int, default=None, help="per answer")
    p.add_argument("--retries", type=int, default=2, help="of a failed call")
    return p.parse_args(argv)


if __name__ == "__main__":
    sys.exit(run(parse_args(sys.argv[1:])))
