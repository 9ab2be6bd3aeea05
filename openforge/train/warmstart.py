"""The supervised warm start: demonstrations the project generates itself, in the exact shape the
built-in ``agent`` harness sends (its system prompt, its ``shell`` tool, the chat template).

The ``echo-words`` recipe demonstrates the demo's tasks ("Write the word W to answer.txt."):
the first answer is one ``shell`` call ``echo W > FILE``, the second (after the tool's result)
is ``Done.``. It runs in three phases. A sequence-length warmup comes first: ``window_steps`` on
the exact demonstrator with each prompt cut to its last ``window`` tokens (the instruction and
the answer; as in the harness-traffic recipe). The copying forms there, in steps that cost a
fraction of a whole prompt's (the agent's system prompt and tool are ~560 of its ~600 tokens),
where on whole prompts it took most of 1,000 steps. Then up to ``steps`` on the exact
demonstrator with whole prompts, until greedy
decoding copies the word on 90% of 16 probe words (checked every 50 steps): the tiny model
learns the format and to copy the word from the prompt. Then ``noisy_steps`` on a demonstrator
that still copies the word but writes to the instructed file only ``correct_fraction`` of the
time (else to ``answer.md``, ``answers.txt``, ``/tmp/answer.txt`` or ``notes.txt``). The
warm-started policy therefore scores about that fraction; following the instruction reliably,
on held-out words too, is the RL run's job. With ``recovery_fraction`` (the recovery config,
issue 53) a quarter of the noisy phase's examples come after a first command that failed, shown
exactly as the ``command_fails_once`` sandbox fault makes the agent see it: the demonstrator
runs the command again that often, else answers ``Done.``; running it again after a failure is
then something RL can reinforce. Words are drawn from the tiny model's one-token
words, held-out words included: the warm start is the baseline the held-out evaluation compares
against.

The result is cached by what decides it (base model, recipe, settings), so reruns and resumed
runs reuse it; the first phase is cached on its own (``warm-exact-KEY``), so changing only the
noisy phase's settings rebuilds only that phase.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from infra.harnesses.agent import prompt_messages, shell_tool, tool_message
from openforge.train.config import HarnessSection
from openforge.train.warm_start_config import WarmStartRecipe, WarmStartSection
from orchestrator.sandbox_faults import failed
from schemas.errors import ConfigError
from trainer.sft import Example, SFTConfig, fine_tune

INSTRUCTION = "Write the word {word} to answer.txt.\n"  # = examples/echo-words/generate.py
WORKDIR = "/app"
TARGET = "answer.txt"
COPY_RATE = 0.9  # phase 1 ends once greedy decoding copies the word this often
WRONG_TARGETS = ("answer.md", "answers.txt", "/tmp/answer.txt", "notes.txt")
RECOVERY_SHARE = 0.25  # of the noisy phase's examples, with recovery_fraction: after a failure
# Settings of the harness-traffic recipe alone: they do not decide this recipe's model.
HARNESS_TRAFFIC_ONLY = ("baseline",)


class EchoWordsData:
    """Draws batches of demonstrations for ``fine_tune``."""

    def __init__(self, model_dir: Path) -> None:
        from transformers import AutoTokenizer

        tok: Any = AutoTokenizer.from_pretrained(str(model_dir))
        end: Any = tok.convert_tokens_to_ids("<|im_end|>")
        self.tok, self.end = tok, int(end)
        # One-token words (with the leading space they have in the command): copying one token
        # is within a tiny model's reach.
        self.words = sorted(
            w for w in _vocabulary() if len(self.tok.encode(" " + w)) == 1 and w.isalpha()
        )
        self.command_timeout_s = agent_command_timeout()
        self.correct_fraction = 1.0
        self.recovery_fraction = 0.0  # > 0: failed first commands shown too (see __call__)
        self.window = 0  # > 0: each prompt cut to its last this many tokens
        self._cache: dict[tuple[str, str], list[Example]] = {}

    def _render(self, messages: list[dict[str, Any]], generation: bool) -> list[int]:
        out = self.tok.apply_chat_template(
            messages, tools=[shell_tool()], add_generation_prompt=generation, tokenize=True
        )
        return list(out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out)

    def _examples(self, word: str, target: str) -> list[Example]:
        """The turns of a clean rollout: (the first prompt, the command), (the prompt after its
        result, ``Done.``); then of one whose command failed: (the prompt after the failure,
        the command again), (the same prompt, ``Done.``)."""
        key = (word, target)
        if key not in self._cache:  # rendering the chat template is most of a step's cost
            self._cache[key] = self._render_examples(word, target)
        return self._cache[key]

    def _render_examples(self, word: str, target: str) -> list[Example]:
        messages = prompt_messages(INSTRUCTION.format(word=word), WORKDIR, self.command_timeout_s)
        first = self._render(messages, generation=True)
        command = f"echo {word} > {target}"
        answered = [*messages, _shell_call("call_1_0", command)]
        completion = self._completion(first, answered)
        done = [*self.tok.encode("Done."), self.end]
        ok = {"exit_code": 0, "stdout": "", "stderr": "", "timed_out": False}
        second = self._render([*answered, self._tool("call_1_0", ok)], generation=True)
        code, stderr = failed(command)
        fault = {"exit_code": code, "stdout": "", "stderr": stderr, "timed_out": False}
        after_fault = [*answered, self._tool("call_1_0", fault)]
        again_prompt = self._render(after_fault, generation=True)
        again = self._completion(again_prompt, [*after_fault, _shell_call("call_2_0", command)])
        return [(first, completion), (second, done), (again_prompt, again), (again_prompt, done)]

    def _completion(self, prompt: list[int], answered: list[dict[str, Any]]) -> list[int]:
        """The tokens of ``answered``'s last (assistant) message after ``prompt``."""
        full = self._render(answered, generation=False)
        # The template ends an assistant turn with "<|im_end|>\n"; the model stops at <|im_end|>.
        end = full.index(self.end, len(prompt))
        return full[len(prompt) : end + 1]

    def _tool(self, call_id: str, result: dict[str, Any]) -> dict[str, Any]:
        return tool_message(call_id, result, self.command_timeout_s)

    def copy_rate(self, model: Any, words: list[str]) -> float:
        """How often greedy decoding copies the word into a well-formed ``echo`` command."""
        import torch

        prompts = [list(self._examples(w, TARGET)[0][0]) for w in words]
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
        attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        out = model.generate(
            ids, attention_mask=attention, do_sample=False, max_new_tokens=40,
            eos_token_id=self.end, pad_token_id=0,
        )  # fmt: skip
        texts = [self.tok.decode(row[width:]) for row in out]
        return sum(f'"echo {w} >' in t for w, t in zip(words, texts, strict=True)) / len(words)

    def __call__(self, rng: random.Random, batch: int) -> list[Example]:
        """A batch: nine tenths first turns, a tenth second turns; with ``recovery_fraction``,
        a quarter are turns after a failed command instead (the command again that often, else
        ``Done.``), the rest in the same proportions."""
        out: list[Example] = []
        while len(out) < batch:
            word = rng.choice(self.words)
            target = TARGET
            if rng.random() >= self.correct_fraction:
                target = rng.choice(WRONG_TARGETS)
            first, second, again, gave_up = self._examples(word, target)
            draw = rng.random()
            if self.recovery_fraction and draw >= 1.0 - RECOVERY_SHARE:
                pick = again if rng.random() < self.recovery_fraction else gave_up
            else:
                pick = first if draw < 0.9 * (1.0 - self._share()) else second
            prompt, completion = pick
            out.append((prompt[-self.window :] if self.window else prompt, completion))
        return out

    def _share(self) -> float:
        return RECOVERY_SHARE if self.recovery_fraction else 0.0


def _shell_call(call_id: str, command: str) -> dict[str, Any]:
    """The assistant message that runs ``command`` with the agent's ``shell`` tool."""
    arguments = json.dumps({"command": command})
    call = {
        "id": call_id,
        "type": "function",
        "function": {"name": "shell", "arguments": arguments},
    }
    return {"role": "assistant", "content": None, "tool_calls": [call]}


def agent_command_timeout() -> float:
    """The per-command timeout the agent harness states in its system prompt."""
    from infra.harnesses import Agent

    return Agent().command_timeout_s


def _vocabulary() -> list[str]:
    from infra.tiny_model import corpus_words

    return corpus_words()


def cache_key(base: Path, ws: WarmStartSection, phase: int = 2) -> str:
    """What decides the warm-started model: the base's files, the recipe, its settings.

    ``phase=1`` keys the exact-demonstrator model alone (its settings without the noisy phase's),
    so a change to ``noisy_steps`` or ``correct_fraction`` reuses it.
    """
    from infra.tiny_model import directory_digest

    settings = {k: str(v) for k, v in vars(ws).items() if k not in HARNESS_TRAFFIC_ONLY}
    if phase == 1:
        for name in ("noisy_steps", "correct_fraction", "noisy_lr", "recovery_fraction"):
            settings.pop(name)
    if settings.get("recovery_fraction") == "0.0":  # added later: off, the key it had before
        settings.pop("recovery_fraction")
    key: dict[str, Any] = {"base": directory_digest(base), "warm_start": settings, "format": 2}
    if phase == 1:
        key["phase"] = 1
    blob = json.dumps(key, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def exact_dir(base: Path, ws: WarmStartSection, cache: Path) -> Path:
    """Where the echo-words recipe keeps its model before the noisy phase (phases 1-2: it
    writes the instructed word), made on the way to the warm start itself."""
    return cache / f"warm-exact-{cache_key(base, ws, phase=1)}"


def warm_start(
    base: Path,
    ws: WarmStartSection,
    harness: HarnessSection,
    cache: Path,
    say: Callable[[str], None] = print,
) -> Path:
    """The warm-started model for ``base`` (``base`` itself for recipe ``none``), built once."""
    if ws.recipe is WarmStartRecipe.NONE:
        return base
    if ws.recipe is not WarmStartRecipe.ECHO_WORDS:  # harness-traffic: harness_warmstart.py
        raise ConfigError(f"warm_start.recipe {ws.recipe.value!r} is not built here")
    if harness.name != "agent":
        raise ConfigError(
            "warm_start.recipe = 'echo-words' demonstrates the built-in agent harness's prompt; "
            f"set harness.name = 'agent' or warm_start.recipe = 'none' (not {harness.name!r})"
        )
    out = cache / f"warm-{cache_key(base, ws)}"
    if (out / "config.json").exists():
        say(f"warm start: reusing {out}")
        return out
    data = EchoWordsData(base)
    say(
        f"warm start: {ws.window_steps} + {ws.steps} + {ws.noisy_steps} SFT steps on echo-words "
        f"demonstrations ({len(data.words)} words; the first phase on the last {ws.window} "
        "tokens of each prompt, the last writes to the instructed file "
        f"{ws.correct_fraction:.0%} of the time{_recovery(ws)}); cached for later runs"
    )
    exact = exact_dir(base, ws, cache)
    if (exact / "config.json").exists():
        say(f"  SFT phases 1-2: reusing {exact}")
    else:
        _exact_phases(base, exact, data, ws, say)
    data.window, data.correct_fraction = 0, ws.correct_fraction
    data.recovery_fraction = ws.recovery_fraction
    lr = ws.noisy_lr or ws.lr
    cfg = SFTConfig(steps=ws.noisy_steps, batch=ws.batch, lr=lr, seed=ws.seed + 1)
    return fine_tune(exact, out, data, cfg, on_step=_reporter(3, ws.noisy_steps, say))


def _recovery(ws: WarmStartSection) -> str:
    if not ws.recovery_fraction:
        return ""
    return f" and, after a failed command, runs it again {ws.recovery_fraction:.0%} of the time"


def _exact_phases(
    base: Path, exact: Path, data: EchoWordsData, ws: WarmStartSection, say: Callable[[str], None]
) -> None:
    """Phases 1 and 2 into ``exact``: the window warmup (skipped with ``window`` or
    ``window_steps`` 0), then whole prompts until greedy decoding copies the word."""
    probe = random.Random(ws.seed).sample(data.words, min(16, len(data.words)))
    data.correct_fraction = 1.0
    current = base
    warmup = exact.with_name(f"{exact.name}-window")
    if ws.window and ws.window_steps:
        data.window = ws.window
        cfg = SFTConfig(steps=ws.window_steps, batch=ws.batch, lr=ws.lr, seed=ws.seed + 2)
        current = fine_tune(base, warmup, data, cfg, on_step=_reporter(1, ws.window_steps, say))
    data.window = 0

    def copies(model: Any) -> bool:
        rate = data.copy_rate(model, probe)
        say(f"  SFT phase 2: greedy copy rate {rate:.2f} on {len(probe)} words")
        return rate >= COPY_RATE

    cfg = SFTConfig(steps=ws.steps, batch=ws.batch, lr=ws.lr, seed=ws.seed)
    fine_tune(current, exact, data, cfg, on_step=_reporter(2, ws.steps, say), done=copies)
    shutil.rmtree(warmup, ignore_errors=True)  # a step on the way, not kept in the cache


def _reporter(phase: int, total: int, say: Callable[[str], None]) -> Callable[[int, float], None]:
    def report(step: int, loss: float) -> None:
        if step % 100 == 0 or step == total:
            say(f"  SFT phase {phase}: step {step}/{total}, loss {loss:.3f}")

    return report
