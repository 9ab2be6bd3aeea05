"""A page's accessibility tree as the browser agent's observation text, with the standard library
only.

    lines, controls = tree_text(nodes)  # nodes: what Accessibility.getFullAXTree gives

One line per node that shows something (a heading, text, a control), in document order; each
control gets a number (``[3] textbox "Email" value=""``) that the actions of
:class:`browser_cdp.Page` take. Like ``browser_cdp.py`` it runs inside a rollout's sandbox (the
``browser`` harness copies both there) and in the web tasks' solutions (the task set's manifest
names this file as shared), so it imports nothing but the standard library.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

# Roles a person acts on: these get numbers.
CONTROLS = {
    "button", "link", "textbox", "searchbox", "combobox", "checkbox", "radio", "menuitem",
    "option", "listbox", "spinbutton", "switch", "slider", "tab", "menuitemcheckbox",
}  # fmt: skip
# Roles shown for what they say.
TEXTS = {"heading", "StaticText", "image", "alert", "status", "cell", "columnheader", "caption"}
FLAGS = ("checked", "selected", "disabled", "required", "expanded")


@dataclass
class Observation:
    """What the page shows: its URL, title and accessibility tree as text; the numbered
    controls' DOM node ids."""

    url: str
    title: str
    text: str
    controls: dict[int, Control] = field(default_factory=dict)  # by number


@dataclass(frozen=True)
class Control:
    """A numbered element: its DOM node, its role and its accessible name."""

    node: int  # the backend DOM node id
    role: str
    name: str


def _prop(node: dict[str, Any], name: str) -> Any:
    for prop in node.get("properties", ()):
        if prop.get("name") == name:
            return prop.get("value", {}).get("value")
    return None


def tree_text(nodes: list[dict[str, Any]]) -> tuple[list[str], dict[int, Control]]:
    """The accessibility tree's nodes (as ``Accessibility.getFullAXTree`` gives them) as the
    observation's lines, in document order, and its numbered controls. Text that only repeats
    its parent's is left out; a drop-down list's options are listed on its line, not numbered.
    Each node is shown once, however the nodes link (no recursion: a deep page is no limit)."""
    by_id = {n["nodeId"]: n for n in nodes if isinstance(n, dict) and "nodeId" in n}
    lines: list[str] = []
    controls: dict[int, Control] = {}
    seen: set[str] = set()
    roots = [n for n in by_id.values() if n.get("parentId") not in by_id]
    stack: list[tuple[dict[str, Any], str | None]] = [(r, None) for r in reversed(roots)]
    while stack:
        node, said = stack.pop()
        if node["nodeId"] in seen:
            continue
        seen.add(node["nodeId"])
        line, said, descend = _line(node, by_id, said, len(controls) + 1)
        if line is not None:
            lines.append(line)
        if _is_control(node):
            controls[len(controls) + 1] = Control(
                node["backendDOMNodeId"], _role(node), _name(node)
            )
        if descend:
            children = [by_id[c] for c in node.get("childIds", ()) if c in by_id]
            stack += [(child, said) for child in reversed(children)]
    return lines, controls


def _role(node: dict[str, Any]) -> str:
    return str((node.get("role") or {}).get("value", ""))


def _name(node: dict[str, Any]) -> str:
    return str((node.get("name") or {}).get("value", "") or "").strip()


def _is_control(node: dict[str, Any]) -> bool:
    """A node that gets a number: shown, a control's role, a DOM node to act on."""
    return (
        not node.get("ignored")
        and _role(node) in CONTROLS
        and isinstance(node.get("backendDOMNodeId"), int)
    )


def _line(
    node: dict[str, Any], by_id: dict[str, dict[str, Any]], said: str | None, number: int
) -> tuple[str | None, str | None, bool]:
    """A node's line (None: it shows nothing), what its children need not repeat, and whether
    its children are shown."""
    role, name = _role(node), _name(node)
    if node.get("ignored"):
        return None, said, True
    if _is_control(node):
        line = f"[{number}] {role} {json.dumps(name)}"
        value = str((node.get("value") or {}).get("value") or "")
        if role in {"textbox", "searchbox", "combobox", "spinbutton"}:
            line += f" value={json.dumps(value)}"
        line += "".join(f" {f}" for f in FLAGS if _prop(node, f) in (True, "true"))
        options = _options(node, by_id, set()) if role == "combobox" else []
        if options:
            return f"{line} options={json.dumps(options)}", said, False
        return line, value or name, True  # a field's text is its value, already on its line
    if role in TEXTS and name and name != said:
        return f"{'text' if role == 'StaticText' else role} {json.dumps(name)}", name, True
    return None, said, True


def _options(node: dict[str, Any], by_id: dict[str, dict[str, Any]], seen: set[str]) -> list[str]:
    out: list[str] = []
    for child in (by_id[c] for c in node.get("childIds", ()) if c in by_id):
        if child["nodeId"] in seen or len(seen) > len(by_id):
            continue
        seen.add(child["nodeId"])
        out += [_name(child)] if _role(child) == "option" else _options(child, by_id, seen)
    return out
