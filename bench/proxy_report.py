"""The measurements of ``bench.proxy_overhead`` and their report: per (dialect, history, clients)
cell the latency each gateway adds over the direct path, requests per second, and the
continuity class of every call through OpenForge read back from its completion event."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from schemas.completion import CompletionEvent
from schemas.enums import CompletionStatus, ContinuityClass, Dialect


@dataclass(frozen=True)
class Level:
    """A client count and how much each client plays at it."""

    clients: int
    threads: int  # conversations per client, one after another
    turns: int  # calls per conversation
    litellm: tuple[int, int] | None = None  # (threads, turns) through LiteLLM; None: not run

    def through_litellm(self) -> Level | None:
        if self.litellm is None:
            return None
        return Level(self.clients, *self.litellm)


@dataclass
class Phase:
    """One path's run of one cell: per call (rollout id, turn, first byte s, last byte s)."""

    calls: list[tuple[str, int, float, float]] = field(default_factory=list)
    wall: float = 0.0

    def totals(self, first_turn: bool = False) -> list[float]:
        """Last-byte latencies of the calls after each thread's first (or of the first ones)."""
        return [total for _, turn, _, total in self.calls if (turn == 0) == first_turn]

    @property
    def rate(self) -> float:
        return len(self.calls) / self.wall if self.wall else 0.0


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


@dataclass
class Cell:
    dialect: Dialect
    history: int  # the target in tokens
    level: Level
    phases: dict[str, Phase] = field(default_factory=dict)

    def added(self, path: str, q: float, first_turn: bool = False) -> float:
        """``path``'s latency minus the direct path's at percentile ``q``, in ms."""
        if path not in self.phases:
            return float("nan")
        mine = pct(self.phases[path].totals(first_turn), q)
        return (mine - pct(self.phases["direct"].totals(first_turn), q)) * 1e3

    def progress(self) -> str:
        parts = [f"{self.dialect} {self.history} tok {self.level.clients} clients:"]
        for path in ("openforge", "relay", "litellm"):
            if path in self.phases:
                parts.append(
                    f"{path} +{self.added(path, 0.5):.2f}/+{self.added(path, 0.99):.2f} ms "
                    f"({self.phases[path].rate:.0f} req/s)"
                )
        return " ".join(parts)


def _classes(
    cell: Cell, events: dict[tuple[str, int], CompletionEvent]
) -> tuple[Counter[str], Counter[str]]:
    """Continuity classes of the OpenForge calls: (after each thread's first, first calls);
    ``lost`` counts calls with no completion event, ``status:X`` calls not recorded OK."""
    measured: Counter[str] = Counter()
    first: Counter[str] = Counter()
    for rid, turn, _, _ in cell.phases["openforge"].calls:
        ev = events.get((rid, turn))
        into = first if turn == 0 else measured
        if ev is None:
            into["lost"] += 1
        elif ev.status is not CompletionStatus.OK:
            into[f"status:{ev.status}"] += 1
        else:
            into[str(ev.continuity)] += 1
    return measured, first


def _prompt_tokens(cell: Cell, events: dict[tuple[str, int], CompletionEvent]) -> str:
    """The prompt length of the threads' first calls as recorded (the history they start with)."""
    lengths = [
        events[(rid, 0)].prompt_length
        for rid, turn, _, _ in cell.phases["openforge"].calls
        if turn == 0 and (rid, 0) in events
    ]
    return f"{sum(lengths) // len(lengths):,}" if lengths else "?"


def _ms(cell: Cell, path: str) -> str:
    if path not in cell.phases:
        return "n/a"
    return f"{cell.added(path, 0.5):.2f} / {cell.added(path, 0.99):.2f}"


def report(
    cells: list[Cell],
    capacity: dict[int, list[Cell]],
    events: dict[tuple[str, int], CompletionEvent],
    sent: int,
    litellm_dialects: list[Dialect],
) -> bool:
    """Print the tables and the goals; False when a measured call was not an exact continuation
    or a call through the proxy was not recorded."""
    print(
        "\n| dialect | history tokens (recorded) | clients | measured calls | direct p50 / p99 ms "
        "| OpenForge added p50 / p99 ms | LiteLLM added p50 / p99 ms | LiteLLM / OpenForge "
        "added p50 | req/s direct / OpenForge / LiteLLM | first call added p50 OpenForge / "
        "LiteLLM ms | OpenForge continuity (measured; first calls) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    bad: list[str] = []
    for c in cells:
        measured, first = _classes(c, events)
        d = c.phases["direct"]
        lite = c.phases.get("litellm")
        ratio = c.added("litellm", 0.5) / c.added("openforge", 0.5) if lite else float("nan")
        rates = " / ".join(
            f"{c.phases[p].rate:,.0f}" if p in c.phases else "n/a"
            for p in ("direct", "openforge", "litellm")
        )
        firsts = " / ".join(
            f"{c.added(p, 0.5, first_turn=True):.1f}" if p in c.phases else "n/a"
            for p in ("openforge", "litellm")
        )
        cls = ", ".join(f"{k} {v}" for k, v in sorted(measured.items()))
        cls += "; " + ", ".join(f"{k} {v}" for k, v in sorted(first.items()))
        print(
            f"| {c.dialect} | {c.history:,} ({_prompt_tokens(c, events)}) | {c.level.clients} "
            f"| {len(d.totals())} | {pct(d.totals(), 0.5) * 1e3:.2f} / "
            f"{pct(d.totals(), 0.99) * 1e3:.2f} | {_ms(c, 'openforge')} | {_ms(c, 'litellm')} "
            f"| {ratio:.0f}x | {rates} | {firsts} | {cls} |"
        )
        if set(measured) != {str(ContinuityClass.EXACT)}:
            bad.append(f"{c.dialect}/{c.history}/{c.level.clients}: measured calls {measured}")
        if set(first) != {str(ContinuityClass.FIRST)}:
            bad.append(f"{c.dialect}/{c.history}/{c.level.clients}: first calls {first}")
    print("\nCapacity (Chat Completions, closed loop, through OpenForge):\n")
    print("| workers | history | clients | req/s direct | req/s OpenForge | added p50 / p99 ms |")
    print("|---|---|---|---|---|---|")
    for w, cs in sorted(capacity.items()):
        for c in cs:
            if c.dialect is Dialect.CHAT and c.level.clients >= 64:
                print(
                    f"| {w} | {c.history:,} | {c.level.clients} | {c.phases['direct'].rate:,.0f} "
                    f"| {c.phases['openforge'].rate:,.0f} | {_ms(c, 'openforge')} |"
                )
    lost = sent - len(events)
    print(
        f"\nLiteLLM dialects: {', '.join(map(str, litellm_dialects)) or 'none'}. Calls through "
        f"OpenForge: {sent:,}; completion events recorded: {len(events):,}; lost: {lost}"
    )
    _floor(cells)
    _goals(cells)
    if lost:
        bad.append(f"{lost} calls through the proxy have no completion event")
    for line in bad:
        print(f"FAILED: {line}")
    return not bad


def _floor(cells: list[Cell]) -> None:
    """The bare relay's added latency (the server stack's floor) beside OpenForge's."""
    relayed = [c for c in cells if "relay" in c.phases]
    if not relayed:
        return
    print(
        "\nFloor: a bare relay on the same server stack (bench.relay), Chat Completions:\n\n"
        "| history tokens | clients | relay added p50 / p99 ms | OpenForge added p50 / p99 ms "
        "| req/s relay / OpenForge | OpenForge minus relay, p50 ms |\n|---|---|---|---|---|---|"
    )
    for c in relayed:
        rates = f"{c.phases['relay'].rate:,.0f} / {c.phases['openforge'].rate:,.0f}"
        extra = c.added("openforge", 0.5) - c.added("relay", 0.5)
        print(
            f"| {c.history:,} | {c.level.clients} | {_ms(c, 'relay')} | {_ms(c, 'openforge')} "
            f"| {rates} | {extra:.2f} |"
        )


def _goals(cells: list[Cell]) -> None:
    """Issue 17's goals against the measured cells (worst dialect and history for each)."""

    def worst(path: str, q: float, clients: int, history: int | None = None) -> float:
        vals = [
            c.added(path, q)
            for c in cells
            if c.level.clients == clients and (history is None or c.history == history)
        ]
        return max(vals) if vals else float("nan")

    big = max((c.history for c in cells), default=0)
    rows = [
        ("1 client, added p50 <= 1 ms", worst("openforge", 0.5, 1), 1.0),
        ("1 client, added p99 <= 3 ms", worst("openforge", 0.99, 1), 3.0),
        (
            f"{big:,}-token history, added p50 <= 2 ms (1 client)",
            worst("openforge", 0.5, 1, big),
            2.0,
        ),
        ("64 clients, added p50 <= 5 ms", worst("openforge", 0.5, 64), 5.0),
        ("64 clients, added p99 <= 20 ms", worst("openforge", 0.99, 64), 20.0),
    ]
    print("\nGoals (issue 17; the worst cell of each row):")
    for name, got, goal in rows:
        verdict = "met" if got <= goal else ("no cell" if got != got else "missed")
        print(f"- {name}: {got:.2f} ms, {verdict}")
    for clients in (16, 64):
        ratios = [
            c.added("litellm", 0.5) / c.added("openforge", 0.5)
            for c in cells
            if c.level.clients == clients and "litellm" in c.phases
        ]
        if ratios:
            verdict = "met" if min(ratios) >= 20 else "missed"
            print(
                f"- {clients} clients, LiteLLM adds >= 20x OpenForge's p50: "
                f"{min(ratios):.1f}x-{max(ratios):.1f}x, {verdict}"
            )
