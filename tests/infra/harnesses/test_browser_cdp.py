"""The browser agent's DevTools driver against real headless Chromium (``scripts/setup
chromium``) and a real page served here: what the model is shown, and each action."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from infra.harnesses.browser_cdp import Browser, BrowserError, Page
from infra.harnesses.browser_main import TOOLS, act
from infra.harnesses.browser_tree import CONTROLS, TEXTS, tree_text
from infra.paths import chromium_binary

FORM = """<!doctype html><html><head><title>Sign up</title></head><body>
<h1>Newsletter</h1><p>One email a week.</p>
<form method="post" action="/done"><label>Email <input name="email"></label>
<label>Plan <select name="plan"><option>Free</option><option value="pro">Pro</option></select>
</label><label><input type="checkbox" name="terms"> I agree</label>
<button type="submit">Subscribe</button></form>
<div style="display:none"><button>Hidden</button></div><a href="/done">Skip</a>
<div style="height:3000px"></div><p id="end">The end</p></body></html>"""


@pytest.fixture(scope="module")
def site() -> Iterator[tuple[str, list[dict[str, str]]]]:
    """A page with a form on a free port; the forms it was sent."""
    posted: list[dict[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self._send(FORM if self.path == "/" else "<title>Done</title><h1>Thanks</h1>")

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"])).decode()
            posted.append({k: v[0] for k, v in parse_qs(body).items()})
            self._send("<title>Done</title><h1>Thanks</h1>")

        def _send(self, text: str) -> None:
            data = text.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", posted
    server.shutdown()
    server.server_close()


@pytest.fixture
def page(tmp_path: Path) -> Iterator[Page]:
    with Browser.launch(str(tmp_path), chromium=str(chromium_binary())) as browser:
        yield browser.page


def test_the_observation_numbers_the_controls_in_document_order(
    page: Page, site: tuple[str, list[dict[str, str]]]
) -> None:
    url, _ = site
    page.goto(url + "/")
    seen = page.observe()
    assert seen.text.splitlines() == [
        f"URL: {url}/",
        "Title: Sign up",
        'heading "Newsletter"',
        'text "One email a week."',
        'text "Email"',
        '[1] textbox "Email" value=""',
        'text "Plan"',
        '[2] combobox "Plan" value="Free" options=["Free", "Pro"]',
        '[3] checkbox "I agree"',
        '[4] button "Subscribe"',
        '[5] link "Skip"',
        'text "The end"',
    ]  # the hidden button is not shown; the options are on their list's line
    assert [(c.role, c.name) for c in seen.controls.values()] == [
        ("textbox", "Email"),
        ("combobox", "Plan"),
        ("checkbox", "I agree"),
        ("button", "Subscribe"),
        ("link", "Skip"),
    ]


def test_typing_choosing_ticking_and_clicking_send_the_form(
    page: Page, site: tuple[str, list[dict[str, str]]]
) -> None:
    url, posted = site
    page.goto(url + "/")
    page.observe()
    page.type(1, "old text")
    page.type(1, "ada@example.org")  # replaces, not appends
    page.select(2, "Pro")
    page.click(3)
    after = page.observe().text
    assert '[1] textbox "Email" value="ada@example.org"' in after
    assert '[2] combobox "Plan" value="Pro"' in after and '[3] checkbox "I agree" checked' in after
    page.click(page.find("button", "Subscribe"))
    assert posted[-1] == {"email": "ada@example.org", "plan": "pro", "terms": "on"}
    assert page.observe().title == "Done"
    png = page.screenshot()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 1000


def test_typing_with_submit_presses_enter(
    page: Page, site: tuple[str, list[dict[str, str]]]
) -> None:
    url, posted = site
    page.goto(url + "/")
    page.type(page.find("textbox", "Email"), "grace@example.org", submit=True)
    assert posted[-1]["email"] == "grace@example.org"
    assert page.evaluate("document.title") == "Done"


def test_bad_actions_say_what_is_wrong_and_leave_the_page_usable(
    page: Page, site: tuple[str, list[dict[str, str]]]
) -> None:
    url, _ = site
    page.goto(url + "/")
    page.observe()
    with pytest.raises(BrowserError, match=r"no element \[42\] on this page \(numbers: 1, 2, 3"):
        page.click(42)
    with pytest.raises(BrowserError, match="has no option 'Gold'"):
        page.select(2, "Gold")
    with pytest.raises(BrowserError, match="only http:// and https:// URLs"):
        page.goto("file:///etc/passwd")
    with pytest.raises(BrowserError, match="cannot open"):
        page.goto("http://127.0.0.1:9/")  # nothing listens on the discard port
    with pytest.raises(BrowserError, match="no button named 'Hidden'"):
        page.goto(url + "/")
        page.find("button", "Hidden")
    page.scroll()
    assert page.evaluate("window.scrollY") > 0
    page.scroll(down=False)
    assert page.evaluate("window.scrollY") == 0


ROLES = [*sorted(CONTROLS | TEXTS), "generic", "RootWebArea", "option", "none"]


@st.composite
def ax_trees(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Accessibility nodes as Chromium sends them, linked at random: a tree, or worse (cycles,
    dangling child ids, several roots)."""
    count = draw(st.integers(1, 30))
    nodes = []
    for i in range(count):
        node: dict[str, Any] = {
            "nodeId": str(i),
            "role": {"type": "role", "value": draw(st.sampled_from(ROLES))},
            "name": {"type": "computedString", "value": draw(st.text(max_size=8))},
            "ignored": draw(st.booleans()),
            "childIds": [str(c) for c in draw(st.lists(st.integers(0, count + 3), max_size=4))],
        }
        if draw(st.booleans()):
            node["backendDOMNodeId"] = 100 + i
        if i and draw(st.booleans()):
            node["parentId"] = str(draw(st.integers(0, i - 1)))
        nodes.append(node)
    return nodes


@settings(max_examples=300, deadline=None)
@given(ax_trees())
def test_any_tree_becomes_lines_with_each_control_numbered_once_in_order(
    nodes: list[dict[str, Any]],
) -> None:
    lines, controls = tree_text(nodes)
    numbered = [line for line in lines if line.startswith("[")]
    assert [int(line[1 : line.index("]")]) for line in numbered] == list(
        range(1, len(controls) + 1)
    )
    by_backend = {n.get("backendDOMNodeId"): n for n in nodes}
    for control in controls.values():
        node = by_backend[control.node]
        assert not node["ignored"] and control.role in CONTROLS
    assert len({c.node for c in controls.values()}) == len(controls)  # each node once
    assert len(lines) <= len(nodes)


@pytest.fixture(scope="module")
def shared_page(
    tmp_path_factory: pytest.TempPathFactory, site: tuple[str, list[dict[str, str]]]
) -> Iterator[Page]:
    with Browser.launch(
        str(tmp_path_factory.mktemp("chromium")), chromium=str(chromium_binary())
    ) as browser:
        browser.page.goto(site[0] + "/")
        yield browser.page


arguments = st.one_of(
    st.text(max_size=20),
    st.just("{"),
    st.dictionaries(
        st.sampled_from(["element", "text", "option", "url", "direction", "submit", "answer"]),
        st.one_of(st.integers(-3, 50), st.text(max_size=10), st.booleans(), st.none()),
        max_size=4,
    ).map(json.dumps),
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.sampled_from([t["name"] for t in TOOLS] + ["rm", ""]), arguments)
@example("click", '{"element": 42}')
@example("type", '{"element": 1}')
@example("select", '{"element": 2, "option": "Gold"}')
@example("navigate", '{"url": "file:///etc/passwd"}')
@example("click", '{"element": "two"}')
@example("type", '{"element": 1, "text": "ada@example.org", "submit": true}')
def test_any_tool_call_of_the_model_gets_a_result_never_a_crash(
    shared_page: Page, site: tuple[str, list[dict[str, str]]], name: str, raw: str
) -> None:
    try:
        args = json.loads(raw)
    except ValueError:
        args = None
    if isinstance(args, dict) and str(args.get("url", "")).startswith("http"):
        raw = json.dumps({**args, "url": site[0] + "/"})  # never away from the test's own site
    shared_page.observe()
    result, answer = act(shared_page, name, raw)
    assert result in ("ok", "done") or result.startswith("error: "), result
    assert (answer is not None) == (result == "done")
    shared_page.goto(site[0] + "/")  # the next example starts from the form again
