"""The browser agent's DevTools driver against real headless Chromium (``scripts/setup
chromium``) and a real page served here: what the model is shown, and each action."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs

import pytest

from infra.harnesses.browser_cdp import Browser, BrowserError, Page
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
