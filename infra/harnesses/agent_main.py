"""OpenForge's built-in agent: a small multi-turn, tool-using loop on the OpenAI SDK.

    python -I agent_main.py --base-url URL/v1 --model NAME --task-file task.md

It runs inside a rollout's sandbox, where the OpenForge repository is not visible, so it imports
only the standard library and the ``openai`` SDK (never ``infra`` or ``schemas``); the
:class:`infra.harnesses.agent.Agent` harness copies it into the rollout's home.

The loop: a Chat Completions call (streamed) with one function tool, ``shell`` (``{"command":
str}``); each call of it runs ``bash -lc COMMAND`` in the working directory under a per-command
timeout and goes back as the tool result; until the model answers without a tool call, the
turn limit, or the deadline. The API key is read from ``$OPENFORGE_API_KEY`` and kept out of
the commands' environment. A call whose stream breaks off is made again, the same, up to
``--retries`` times.

Output, one JSON object per line on stdout: ``{"type": "step", ...}`` after each model answer,
``{"type": "tool", ...}`` after each command, ``{"type": "error", ...}`` for a failed call, and
last ``{"type": "final", "final_message", "session_id", "stop", "turns"}``. ``stop`` is
``answer``, ``max_turns``, ``deadline`` or ``error``; the exit code is 1 for ``error``, else 0.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:  # imported where used, so the harness can read this module's prompt without it
    import openai

API_KEY_ENV = "OPENFORGE_API_KEY"

SHELL_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "shell",
        "description": (
            "Run a bash command in the workspace and return its exit code, stdout and stderr. "
            "Each call is a fresh `bash -lc` in the workspace directory."
        ),
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "The bash command."}},
            "required": ["command"],
        },
    },
}

SYSTEM = """\
You are an autonomous agent in a Linux sandbox. Your workspace is {cwd}. Use the `shell` tool \
to inspect files and run commands (each command runs with `bash -lc` in the workspace and may \
take at most {timeout:.0f} seconds). Work until the task is done, then reply with a short \
summary of what you did, without calling a tool."""


def emit(kind: str, **fields: Any) -> None:
    print(json.dumps({"type": kind, **fields}), flush=True)


def run_shell(command: str, cwd: Path, timeout_s: float, max_chars: int) -> dict[str, Any]:
    """Run ``bash -lc command`` in its own process group; kill the group at the timeout."""
    env = {k: v for k, v in os.environ.items() if k != API_KEY_ENV}
    start = time.monotonic()
    proc = subprocess.Popen(
        ["bash", "-lc", command],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    timed_out = False
    try:
        out, err = proc.communicate(timeout=max(timeout_s, 0.1))
    except subprocess.TimeoutExpired:
        timed_out = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()

    def text(data: bytes) -> str:
        s = data.decode("utf-8", errors="replace")
        half = max_chars // 2
        return s if len(s) <= max_chars else f"{s[:half]}\n[...]\n{s[-half:]}"

    return {
        "exit_code": proc.returncode,
        "timed_out": timed_out,
        "stdout": text(out),
        "stderr": text(err),
        "duration_s": round(time.monotonic() - start, 3),
    }


def tool_result(call: dict[str, str], cwd: Path, timeout_s: float, max_chars: int) -> str:
    """The tool message's text for one call (an error text for a malformed call)."""
    if call["name"] != "shell":
        return f"error: unknown tool {call['name']!r}; the only tool is `shell`"
    try:
        args = json.loads(call["arguments"] or "{}")
    except ValueError:
        args = None
    if not isinstance(args, dict) or not isinstance(args.get("command"), str):
        return 'error: the arguments must be a JSON object {"command": "<bash command>"}'
    result = run_shell(args["command"], cwd, timeout_s, max_chars)
    emit("tool", call_id=call["id"], command=args["command"], **result)
    return result_text(result, timeout_s)


def result_text(result: dict[str, Any], timeout_s: float) -> str:
    """The tool message's text for a command's result."""
    head = f"exit code: {result['exit_code']}" + (
        f" (killed after {timeout_s:.0f} s)" if result["timed_out"] else ""
    )
    return f"{head}\nstdout:\n{result['stdout']}\nstderr:\n{result['stderr']}"


def initial_messages(task: str, cwd: Path | str, command_timeout_s: float) -> list[dict[str, Any]]:
    """The conversation's start: the system prompt and the task."""
    return [
        {"role": "system", "content": SYSTEM.format(cwd=cwd, timeout=command_timeout_s)},
        {"role": "user", "content": task},
    ]


def complete(
    client: openai.OpenAI,
    model: str,
    messages: list[dict[str, Any]],
    timeout_s: float,
    max_tokens: int | None,
) -> tuple[str, list[dict[str, str]], str | None]:
    """One streamed call: (content, tool calls {id, name, arguments}, finish reason)."""
    extra: dict[str, Any] = {} if max_tokens is None else {"max_tokens": max_tokens}
    stream = client.chat.completions.create(
        model=model,
        messages=cast(Any, messages),
        tools=cast(Any, [SHELL_TOOL]),
        stream=True,
        timeout=timeout_s,
        **extra,
    )
    content: list[str] = []
    calls: dict[int, dict[str, str]] = {}
    finish: str | None = None
    for chunk in stream:
        for choice in chunk.choices[:1]:
            delta = choice.delta
            if delta.content:
                content.append(delta.content)
            for part in delta.tool_calls or []:
                slot = calls.setdefault(part.index, {"id": "", "name": "", "arguments": ""})
                slot["id"] = part.id or slot["id"]
                if part.function is not None:
                    slot["name"] += part.function.name or ""
                    slot["arguments"] += part.function.arguments or ""
            finish = choice.finish_reason or finish
    return "".join(content), [calls[i] for i in sorted(calls)], finish


def retryable(exc: openai.APIError) -> bool:
    """Worth making again: a broken stream, a timeout, an error the server reported inside the
    stream (the proxy does so when its upstream breaks off), 408, 409, 429 and 5xx answers."""
    import openai

    if isinstance(exc, openai.APIStatusError):
        return exc.status_code in (408, 409, 429) or exc.status_code >= 500
    return True


def complete_with_retries(
    client: openai.OpenAI, args: argparse.Namespace, messages: list[dict[str, Any]], deadline: float
) -> tuple[str, list[dict[str, str]], str | None]:
    """:func:`complete`, made again (the same call) while the error is :func:`retryable`."""
    import openai

    attempt = 0
    while True:
        try:
            left = deadline - time.monotonic()
            return complete(client, args.model, messages, max(left, 1.0), args.max_tokens)
        except openai.APIError as exc:
            attempt += 1
            again = retryable(exc) and attempt <= args.retries and deadline - time.monotonic() > 2
            if not again:
                raise
            emit("error", message=f"{type(exc).__name__}: {exc}", attempt=attempt, retrying=True)
            time.sleep(min(0.5 * 2 ** (attempt - 1), 4.0))


def run(args: argparse.Namespace) -> int:
    import openai

    session_id = str(uuid.uuid4())
    deadline = time.monotonic() + args.time_limit
    cwd = Path.cwd()
    task = Path(args.task_file).read_text(encoding="utf-8")
    client = openai.OpenAI(
        base_url=args.base_url, api_key=os.environ.get(API_KEY_ENV) or "none", max_retries=0
    )
    messages = initial_messages(task, cwd, args.command_timeout)
    emit("start", session_id=session_id, model=args.model, cwd=str(cwd))
    final: str | None = None
    stop, turns = "max_turns", 0
    while turns < args.max_turns:
        if deadline - time.monotonic() <= 0:
            stop = "deadline"
            break
        turns += 1
        try:
            content, calls, finish = complete_with_retries(client, args, messages, deadline)
        except openai.APIError as exc:
            emit("error", message=f"{type(exc).__name__}: {exc}", retrying=False)
            stop = "error"
            break
        for n, call in enumerate(calls):
            call["id"] = call["id"] or f"call_{turns}_{n}"
        emit("step", turn=turns, content=content, tool_calls=calls, finish_reason=finish)
        final = content or final
        if not calls:
            stop = "answer"
            break
        messages.append(
            {
                "role": "assistant",
                "content": content or None,
                "tool_calls": [
                    {
                        "id": c["id"],
                        "type": "function",
                        "function": {"name": c["name"], "arguments": c["arguments"]},
                    }
                    for c in calls
                ],
            }
        )
        for call in calls:
            left = deadline - time.monotonic()
            timeout = min(args.command_timeout, max(left, 0.1))
            result = tool_result(call, cwd, timeout, args.max_output_chars)
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    emit("final", final_message=final, session_id=session_id, stop=stop, turns=turns)
    return 1 if stop == "error" else 0


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--base-url", required=True, help="the OpenAI-compatible base URL (.../v1)")
    p.add_argument("--model", required=True)
    p.add_argument("--task-file", required=True, help="the task's instruction, as text")
    p.add_argument("--max-turns", type=int, default=8, help="model calls at most")
    p.add_argument("--time-limit", type=float, default=600.0, help="seconds for the whole run")
    p.add_argument("--command-timeout", type=float, default=120.0, help="seconds per command")
    p.add_argument("--max-output-chars", type=int, default=16000, help="per stream of a command")
    p.add_argument("--max-tokens", type=int, default=None, help="per answer (default: server's)")
    p.add_argument("--retries", type=int, default=2, help="of a failed call")
    return p.parse_args(argv)


if __name__ == "__main__":
    sys.exit(run(parse_args(sys.argv[1:])))
