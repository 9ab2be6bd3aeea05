"""Inline SVG charts for the audit page, drawn in Python (no script, font or file outside the page).

Every chart is one ``<svg class="chart" data-chart=NAME data-marks=N>`` element; each drawn datum
(a bar, a bar segment, a point, a lineage node) is an element of class ``mark``, and ``N`` is
their count. A chart without data is the same element with ``data-marks="0"`` and the text
"no data", so a page always has every chart.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from html import escape

PALETTE = (
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2",
    "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac",
)  # fmt: skip
WIDTH = 640
ROW = 22  # height of one horizontal bar row
LABEL_W = 170  # room for category labels on the left


@dataclass(frozen=True)
class Chart:
    """A drawn chart: its name, its SVG element and how many data marks it drew."""

    name: str
    svg: str
    marks: int


def _t(value: object) -> str:
    return escape(str(value), quote=True)


def _num(value: float) -> str:
    if value == 0 or 0.01 <= abs(value) < 10_000:
        return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
    return f"{value:.2e}"


def _svg(name: str, title: str, height: int, body: list[str], marks: int) -> Chart:
    svg = (
        f'<svg class="chart" data-chart="{_t(name)}" data-marks="{marks}" role="img" '
        f'xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}" '
        f'width="{WIDTH}" height="{height}"><title>{_t(title)}</title>' + "".join(body) + "</svg>"
    )
    return Chart(name, svg, marks)


def no_data(name: str, title: str) -> Chart:
    """The chart ``name`` without data: a box saying so."""
    body = [
        f'<rect x="0.5" y="0.5" width="{WIDTH - 1}" height="59" fill="none" stroke="#ccc"/>',
        f'<text class="no-data" x="{WIDTH // 2}" y="35" text-anchor="middle" '
        'fill="#888">no data</text>',
    ]
    return _svg(name, title, 60, body, 0)


def _legend(names: Sequence[str], y: int) -> list[str]:
    out, x = [], LABEL_W
    for i, name in enumerate(names):
        colour = PALETTE[i % len(PALETTE)]
        out.append(f'<rect x="{x}" y="{y - 9}" width="10" height="10" fill="{colour}"/>')
        out.append(f'<text x="{x + 14}" y="{y}" font-size="11">{_t(name)}</text>')
        x += 24 + 7 * len(str(name))
    return out


def bars(name: str, title: str, labels: Sequence[str], values: Sequence[float | None]) -> Chart:
    """Horizontal bars, one per label, with the value written at the bar's end."""
    pairs = [(lab, float(v)) for lab, v in zip(labels, values, strict=True) if v is not None]
    if not pairs:
        return no_data(name, title)
    top = max(max(v for _, v in pairs), 0.0) or 1.0
    scale = (WIDTH - LABEL_W - 60) / top
    body = []
    for i, (label, value) in enumerate(pairs):
        y = 6 + i * ROW
        w = max(value, 0.0) * scale
        body.append(
            f'<text x="{LABEL_W - 6}" y="{y + 14}" text-anchor="end" font-size="11">'
            f"{_t(label)[:28]}</text>"
        )
        body.append(
            f'<rect class="mark" x="{LABEL_W}" y="{y + 2}" width="{max(w, 1.0):.1f}" '
            f'height="{ROW - 6}" fill="{PALETTE[0]}"><title>{_t(label)}: {_num(value)}</title>'
            "</rect>"
        )
        body.append(
            f'<text x="{LABEL_W + w + 4:.1f}" y="{y + 14}" font-size="11">{_num(value)}</text>'
        )
    return _svg(name, title, 12 + len(pairs) * ROW, body, len(pairs))


def stacked(
    name: str,
    title: str,
    rows: Mapping[str, Mapping[str, float]],
    order: Sequence[str] | None = None,
) -> Chart:
    """Horizontal bars split into classes: one bar per row label, one colour per class (in
    ``order``, else alphabetical)."""
    present = {c for counts in rows.values() for c in counts}
    classes = [c for c in order if c in present] if order else sorted(present)
    if not rows or not classes:
        return no_data(name, title)
    top = max(sum(counts.values()) for counts in rows.values()) or 1.0
    scale = (WIDTH - LABEL_W - 60) / top
    body, marks = [], 0
    for i, (label, counts) in enumerate(rows.items()):
        y, x = 6 + i * ROW, float(LABEL_W)
        body.append(
            f'<text x="{LABEL_W - 6}" y="{y + 14}" text-anchor="end" font-size="11">'
            f"{_t(label)[:28]}</text>"
        )
        for j, cls in enumerate(classes):
            value = counts.get(cls, 0)
            if value <= 0:
                continue
            w = value * scale
            body.append(
                f'<rect class="mark" x="{x:.1f}" y="{y + 2}" width="{max(w, 1.0):.1f}" '
                f'height="{ROW - 6}" fill="{PALETTE[j % len(PALETTE)]}">'
                f"<title>{_t(label)} {_t(cls)}: {_num(value)}</title></rect>"
            )
            x += w
            marks += 1
        body.append(
            f'<text x="{x + 4:.1f}" y="{y + 14}" font-size="11">{_num(sum(counts.values()))}</text>'
        )
    height = 12 + len(rows) * ROW
    body += _legend(classes, height + 8)
    return _svg(name, title, height + 16, body, marks)


def _axis(lo: float, hi: float, ticks: int = 5) -> list[float]:
    span = hi - lo or 1.0
    step = 10 ** math.floor(math.log10(span / ticks))
    for m in (1, 2, 5, 10):
        if span / (step * m) <= ticks:
            step *= m
            break
    start = math.floor(lo / step) * step
    return [start + k * step for k in range(int((hi - start) / step) + 2)]


def lines(
    name: str, title: str, series: Mapping[str, Sequence[tuple[float, float]]], x_label: str
) -> Chart:
    """Points joined by lines, one colour per series, on shared x and y axes."""
    points = [p for pts in series.values() for p in pts]
    if not points:
        return no_data(name, title)
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    yt = _axis(min(min(ys), 0.0), max(ys))
    x0, x1 = min(xs), max(xs) if max(xs) > min(xs) else min(xs) + 1
    y0, y1 = yt[0], yt[-1]
    left, right, top, bottom = 50, WIDTH - 20, 10, 190

    def px(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * (right - left)

    def py(y: float) -> float:
        return bottom - (y - y0) / ((y1 - y0) or 1.0) * (bottom - top)

    body = [f'<line x1="{left}" y1="{bottom}" x2="{right}" y2="{bottom}" stroke="#999"/>']
    body += _y_grid(yt, py, left, right)
    for x in sorted(set(xs))[:: max(1, len(set(xs)) // 10)]:
        body.append(
            f'<text x="{px(x):.1f}" y="{bottom + 14}" text-anchor="middle" font-size="10">'
            f"{_num(x)}</text>"
        )
    body.append(
        f'<text x="{(left + right) // 2}" y="{bottom + 28}" text-anchor="middle" '
        f'font-size="11">{_t(x_label)}</text>'
    )
    marks = 0
    for i, (label, pts) in enumerate(series.items()):
        colour = PALETTE[i % len(PALETTE)]
        ordered = sorted(pts)
        if len(ordered) > 1:
            path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in ordered)
            body.append(
                f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"/>'
            )
        for x, y in ordered:
            body.append(
                f'<circle class="mark" cx="{px(x):.1f}" cy="{py(y):.1f}" r="3.5" '
                f'fill="{colour}"><title>{_t(label)} {_num(x)}: {_num(y)}</title></circle>'
            )
            marks += 1
    body += _legend(list(series), bottom + 46)
    return _svg(name, title, bottom + 54, body, marks)


def _y_grid(
    ticks: Sequence[float], py: Callable[[float], float], left: float, right: float
) -> list[str]:
    """Horizontal grid lines at ``ticks``, labelled on the left."""
    return [
        f'<line x1="{left}" y1="{py(y):.1f}" x2="{right}" y2="{py(y):.1f}" stroke="#eee"/>'
        f'<text x="{left - 4}" y="{py(y) + 4:.1f}" text-anchor="end" font-size="10">'
        f"{_num(y)}</text>"
        for y in ticks
    ]


def grouped(
    name: str, title: str, labels: Sequence[str], series: Mapping[str, Sequence[float | None]]
) -> Chart:
    """Vertical bars grouped by label, one colour per series (e.g. p50/p90/p99 per dialect)."""
    values = [v for vs in series.values() for v in vs if v is not None]
    if not labels or not values:
        return no_data(name, title)
    yt = _axis(0.0, max(values))
    left, right, top, bottom = 50, WIDTH - 20, 10, 170
    group_w = (right - left) / len(labels)
    bar_w = group_w * 0.8 / max(len(series), 1)

    def py(y: float) -> float:
        return bottom - y / (yt[-1] or 1.0) * (bottom - top)

    body = [f'<line x1="{left}" y1="{bottom}" x2="{right}" y2="{bottom}" stroke="#999"/>']
    body += _y_grid(yt, py, left, right)
    marks = 0
    for g, label in enumerate(labels):
        gx = left + g * group_w + group_w * 0.1
        body.append(
            f'<text x="{left + (g + 0.5) * group_w:.1f}" y="{bottom + 14}" '
            f'text-anchor="middle" font-size="11">{_t(label)}</text>'
        )
        for s, (sname, vs) in enumerate(series.items()):
            v = vs[g]
            if v is None:
                continue
            h = max(bottom - py(v), 1.0)
            body.append(
                f'<rect class="mark" x="{gx + s * bar_w:.1f}" y="{bottom - h:.1f}" '
                f'width="{bar_w * 0.9:.1f}" height="{h:.1f}" fill="{PALETTE[s % len(PALETTE)]}">'
                f"<title>{_t(label)} {_t(sname)}: {_num(v)}</title></rect>"
            )
            marks += 1
    body += _legend(list(series), bottom + 34)
    return _svg(name, title, bottom + 42, body, marks)


def lineage(
    name: str, title: str, step: int | None, rows: Sequence[tuple[str, str, str, float | None]]
) -> Chart:
    """A step's lineage as a tree: the step, the tasks it trained on, and each task's rollouts
    (rows: task, rollout id, harness, reward), coloured by harness."""
    if step is None or not rows:
        return no_data(name, title)
    tasks = sorted({r[0] for r in rows})
    harnesses = sorted({r[2] for r in rows})
    height = max(60, 14 + len(rows) * 22)
    body = [
        f'<rect class="mark" x="6" y="{height / 2 - 14:.1f}" width="90" height="28" rx="6" '
        f'fill="#333"><title>step {step}</title></rect>'
        f'<text x="51" y="{height / 2 + 4:.1f}" text-anchor="middle" fill="#fff" '
        f'font-size="12">step {step}</text>'
    ]
    marks, y = 1, 10.0
    for task in tasks:
        mine = [r for r in rows if r[0] == task]
        ty = y + (len(mine) - 1) * 11 + 7
        body.append(
            f'<path d="M96 {height / 2:.1f} C 140 {height / 2:.1f}, 140 {ty:.1f}, 180 {ty:.1f}" '
            'fill="none" stroke="#bbb"/>'
            f'<rect class="mark" x="180" y="{ty - 9:.1f}" width="150" height="18" rx="4" '
            f'fill="#eee" stroke="#999"><title>task {_t(task)}</title></rect>'
            f'<text x="186" y="{ty + 4:.1f}" font-size="11">{_t(task)[:22]}</text>'
        )
        marks += 1
        for _, rollout, harness, reward in mine:
            ry = y + 7
            colour = PALETTE[harnesses.index(harness) % len(PALETTE)]
            label = f"{rollout[:34]}  {'-' if reward is None else _num(reward)}"
            body.append(
                f'<path d="M330 {ty:.1f} C 360 {ty:.1f}, 360 {ry:.1f}, 390 {ry:.1f}" '
                'fill="none" stroke="#bbb"/>'
                f'<rect class="mark" x="390" y="{ry - 7:.1f}" width="12" height="12" '
                f'fill="{colour}"><title>{_t(rollout)} ({_t(harness)}) reward '
                f"{_t(reward)}</title></rect>"
                f'<text x="406" y="{ry + 4:.1f}" font-size="10">{_t(label)}</text>'
            )
            marks += 1
            y += 22
    body += _legend(harnesses, height + 10)
    return _svg(name, title, height + 18, body, marks)


TIMELINE_KINDS = ("rollout", "evaluation", "update", "sync")


def timeline(
    name: str, title: str, lanes: Sequence[tuple[str, Sequence[tuple[float, float, str, str]]]]
) -> Chart:
    """A Gantt chart: one row per lane (its label on the left), each interval ``(start, end,
    kind, label)`` a bar coloured by its kind (:data:`TIMELINE_KINDS`), on a shared seconds
    axis."""
    spans = [span for _, row in lanes for span in row]
    if not spans:
        return no_data(name, title)
    hi = max(end for _, end, _, _ in spans) or 1.0
    ticks = [t for t in _axis(0.0, hi) if t <= hi * 1.001]
    scale = (WIDTH - LABEL_W - 20) / (ticks[-1] if ticks and ticks[-1] >= hi else hi)
    row_h = 14
    body, marks = [], 0
    for i, (lane, row) in enumerate(lanes):
        y = 6 + i * row_h
        body.append(
            f'<text x="{LABEL_W - 6}" y="{y + 10}" text-anchor="end" font-size="9">'
            f"{_t(lane)[:28]}</text>"
        )
        for start, end, kind, label in row:
            colour = PALETTE[TIMELINE_KINDS.index(kind) % len(PALETTE)]
            x, w = LABEL_W + start * scale, max((end - start) * scale, 1.0)
            body.append(
                f'<rect class="mark" x="{x:.1f}" y="{y + 1}" width="{w:.1f}" height="{row_h - 3}" '
                f'fill="{colour}"><title>{_t(kind)} {_t(label)}: {_num(start)}-{_num(end)} s'
                "</title></rect>"
            )
            marks += 1
    axis_y = 10 + len(lanes) * row_h
    for t in ticks:
        x = LABEL_W + t * scale
        body.append(f'<line x1="{x:.1f}" y1="4" x2="{x:.1f}" y2="{axis_y - 4}" stroke="#eee"/>')
        body.append(
            f'<text x="{x:.1f}" y="{axis_y + 8}" text-anchor="middle" font-size="10">'
            f"{_num(t)}</text>"
        )
    body.append(
        f'<text x="{WIDTH - 4}" y="{axis_y + 20}" text-anchor="end" font-size="10">seconds</text>'
    )
    body += _legend(list(TIMELINE_KINDS), axis_y + 34)
    return _svg(name, title, axis_y + 42, body, marks)


THUMB_W, THUMB_H, CAPTION_H = 200, 150, 30  # a screenshot in the gallery, and its caption


def gallery(name: str, title: str, items: Sequence[tuple[str, str | None]]) -> Chart:
    """Screenshots in rows of three, each with its caption; an item is (caption, the image as
    a data URL, or None when its bytes were not stored: a grey box saying so)."""
    if not items:
        return no_data(name, title)
    body, marks, per_row = [], 0, 3
    for i, (caption, url) in enumerate(items):
        x = 10 + (i % per_row) * (THUMB_W + 10)
        y = 6 + (i // per_row) * (THUMB_H + CAPTION_H)
        if url is None:
            body.append(
                f'<rect x="{x}" y="{y}" width="{THUMB_W}" height="{THUMB_H}" fill="#eee"/>'
                f'<text x="{x + THUMB_W // 2}" y="{y + THUMB_H // 2}" text-anchor="middle" '
                'font-size="11" fill="#888">image not stored</text>'
            )
        else:
            body.append(
                f'<image class="mark" x="{x}" y="{y}" width="{THUMB_W}" height="{THUMB_H}" '
                f'preserveAspectRatio="xMidYMid meet" href="{_t(url)}"><title>{_t(caption)}'
                "</title></image>"
            )
            marks += 1
        body.append(
            f'<rect x="{x}" y="{y}" width="{THUMB_W}" height="{THUMB_H}" fill="none" '
            f'stroke="#ccc"/><text x="{x}" y="{y + THUMB_H + 14}" font-size="10">'
            f"{_t(caption)[:40]}</text>"
        )
    rows = (len(items) + per_row - 1) // per_row
    return _svg(name, title, 12 + rows * (THUMB_H + CAPTION_H), body, marks)
