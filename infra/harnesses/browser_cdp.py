"""Headless Chromium driven over the DevTools protocol, with the standard library only.

    page = Browser.launch(home="/tmp/x").page
    page.goto("http://127.0.0.1:8765/")
    print(page.observe().text)        # the accessibility tree, interactive elements numbered
    page.type(3, "ada@example.org", submit=True)

It runs inside a rollout's sandbox (the ``browser`` harness copies it there, beside
``browser_main.py`` and ``browser_tree.py``) and in the web tasks' solutions (their manifest
names it as a shared file, copied in when the task set is loaded), so that a solution is the
same scripted browser run; it imports nothing but the standard library and ``browser_tree``.
Chromium is started with ``--remote-debugging-pipe``: the protocol goes over two pipes (its fd 3
in, fd 4 out; messages end with a NUL byte), so no port is opened. Chromium's own sandbox is off
(``--no-sandbox``): the rollout's sandbox is the isolation, and a user namespace inside it is not
available.

The observation (:meth:`Page.observe`) is the page's accessibility tree as text
(``browser_tree.py``): each control gets a number that the actions (:meth:`Page.click`,
:meth:`Page.type`, :meth:`Page.select`) take. Numbers are valid until the next observation.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING or __package__:  # imported as infra.harnesses.browser_cdp
    from infra.harnesses.browser_tree import Control, Observation, tree_text
else:  # a copy in a sandbox or a solution: browser_tree.py is beside it
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from browser_tree import Control, Observation, tree_text

CHROMIUM_NAMES = ("chromium", "chromium-browser", "/usr/lib/chromium/chromium")
# Headless, no sandbox of its own (the rollout's is the isolation), nothing it would fetch or
# report by itself.
CHROMIUM_FLAGS = (
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
    "--no-first-run", "--no-default-browser-check", "--disable-extensions",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-default-apps", "--disable-crash-reporter", "--mute-audio", "--hide-scrollbars",
)  # fmt: skip


class BrowserError(Exception):
    """Chromium failed, or an action could not be done (the message says why)."""


def find_chromium(explicit: str | None = None) -> str:
    """``explicit``, else ``$OPENFORGE_CHROMIUM``, else the first Chromium on PATH."""
    for name in (explicit, os.environ.get("OPENFORGE_CHROMIUM"), *CHROMIUM_NAMES):
        if name and (found := shutil.which(name)):
            return found
    raise BrowserError("no Chromium found: install Debian's chromium package in the image")


class Pipe:
    """One DevTools connection: commands out, replies matched by id, events kept in order."""

    def __init__(self, write_fd: int, read_fd: int, timeout_s: float) -> None:
        self.write_fd, self.read_fd, self.timeout_s = write_fd, read_fd, timeout_s
        self.events: list[dict[str, Any]] = []
        self._buffer = b""
        self._next_id = 0

    def call(self, method: str, session: str | None = None, **params: Any) -> dict[str, Any]:
        """Send one command and wait for its reply's ``result`` (BrowserError on an error)."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        data = json.dumps(message).encode() + b"\0"
        while data:
            data = data[os.write(self.write_fd, data) :]
        deadline = time.monotonic() + self.timeout_s
        while True:
            reply = self._read(deadline)
            if reply is None:
                raise BrowserError(f"{method}: no answer from Chromium in {self.timeout_s:.0f}s")
            if reply.get("id") != self._next_id:
                if "method" in reply:
                    self.events.append(reply)
                continue
            if "error" in reply:
                raise BrowserError(f"{method}: {reply['error'].get('message', reply['error'])}")
            return dict(reply.get("result") or {})

    def drain(self, seconds: float) -> None:
        """Read the events Chromium sends for ``seconds``."""
        deadline = time.monotonic() + seconds
        while (message := self._read(deadline)) is not None:
            if "method" in message:
                self.events.append(message)

    def _read(self, deadline: float) -> dict[str, Any] | None:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.read_fd], [], [], left)[0]:
                return None
            chunk = os.read(self.read_fd, 1 << 20)
            if not chunk:
                raise BrowserError("Chromium closed its DevTools pipe (it exited)")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        value = json.loads(raw)
        return value if isinstance(value, dict) else None


@dataclass
class Page:
    """One tab, attached by a flat session."""

    pipe: Pipe
    session: str
    allowed_schemes: tuple[str, ...] = ("http://", "https://")
    _controls: dict[int, Control] = field(default_factory=dict)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        return self.pipe.call(method, self.session, **params)

    def goto(self, url: str) -> None:
        if not url.startswith(self.allowed_schemes):
            raise BrowserError(f"only {' and '.join(self.allowed_schemes)} URLs, not {url!r}")
        previous = self.evaluate("location.href")
        answer = self.call("Page.navigate", url=url)
        if answer.get("errorText"):
            # Chromium now shows its error page: go back to where the page was.
            if isinstance(previous, str) and previous.startswith(self.allowed_schemes):
                self.call("Page.navigate", url=previous)
                self.settle()
            raise BrowserError(f"cannot open {url}: {answer['errorText']}")
        self.settle()

    def settle(self, timeout_s: float = 10.0) -> None:
        """Wait for a navigation the last action started (if any) to load, then for the
        document to be complete."""
        self.pipe.drain(0.15)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            state = self.evaluate("document.readyState")
            if state == "complete":
                return
            time.sleep(0.05)

    def evaluate(self, expression: str) -> Any:
        answer = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return answer.get("result", {}).get("value")

    def observe(self) -> Observation:
        lines, controls = tree_text(self.call("Accessibility.getFullAXTree")["nodes"])
        url, title = self.evaluate("location.href"), self.evaluate("document.title")
        self._controls = controls
        text = f"URL: {url}\nTitle: {title}\n" + "\n".join(lines)
        return Observation(str(url), str(title), text, controls)

    def screenshot(self) -> bytes:
        """The viewport as PNG."""
        return base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"])

    def find(self, role: str, name: str) -> int:
        """The number of the first control with this role and name on the page now (a scripted
        run's way to name an element)."""
        for number, control in self.observe().controls.items():
            if control.role == role and control.name.casefold() == name.casefold():
                return number
        raise BrowserError(f"no {role} named {name!r} on {self.evaluate('location.href')}")

    def _node(self, number: int) -> int:
        if number not in self._controls:
            known = ", ".join(str(n) for n in sorted(self._controls)) or "none"
            raise BrowserError(f"no element [{number}] on this page (numbers: {known})")
        return self._controls[number].node

    def _object(self, number: int) -> str:
        answer = self.call("DOM.resolveNode", backendNodeId=self._node(number))
        return str(answer["object"]["objectId"])

    def _run_on(self, number: int, function: str, *args: Any) -> Any:
        answer = self.call(
            "Runtime.callFunctionOn",
            objectId=self._object(number),
            functionDeclaration=function,
            arguments=[{"value": a} for a in args],
            returnByValue=True,
        )
        return answer.get("result", {}).get("value")

    def click(self, number: int) -> None:
        """A left click at the element's centre (scrolled into view), as a person clicks."""
        node = self._node(number)
        self.call("DOM.scrollIntoViewIfNeeded", backendNodeId=node)
        try:
            quads = self.call("DOM.getContentQuads", backendNodeId=node)["quads"]
        except BrowserError:
            quads = []
        if not quads:
            raise BrowserError(f"element [{number}] is not visible: it cannot be clicked")
        xs, ys = quads[0][0::2], quads[0][1::2]
        x, y = sum(xs) / len(xs), sum(ys) / len(ys)
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)
        self.settle()

    def type(self, number: int, text: str, submit: bool = False) -> None:
        """Replace the field's text with ``text`` as typed keys; Enter after it with ``submit``."""
        self.call("DOM.focus", backendNodeId=self._node(number))
        self._run_on(number, "function(){ if ('value' in this) { this.value = ''; } }")
        self.call("Input.insertText", text=text)
        if submit:
            for kind in ("keyDown", "keyUp"):
                self.call(
                    "Input.dispatchKeyEvent",
                    type=kind,
                    key="Enter",
                    code="Enter",
                    windowsVirtualKeyCode=13,
                    text="\r" if kind == "keyDown" else "",
                )
        self.settle()

    def select(self, number: int, option: str) -> None:
        """Choose the option of a drop-down list whose text or value is ``option``."""
        chosen = self._run_on(number, _SELECT, option)
        if chosen is None:
            raise BrowserError(f"element [{number}] has no option {option!r}")
        self.settle()

    def scroll(self, down: bool = True) -> None:
        self.evaluate(f"window.scrollBy(0, {'' if down else '-'}0.8 * window.innerHeight)")
        self.settle()


_SELECT = """function(option) {
  if (!this.options) { return null; }
  for (const o of this.options) {
    if (o.text.trim() === option || o.value === option) {
      this.value = o.value;
      this.dispatchEvent(new Event('input', {bubbles: true}));
      this.dispatchEvent(new Event('change', {bubbles: true}));
      return o.value;
    }
  }
  return null;
}"""


def _spawn(
    argv: list[str], log_path: str, timeout_s: float
) -> tuple[subprocess.Popen[bytes], Pipe]:
    """Chromium started with the DevTools pipe as its fds 3 (in) and 4 (out), in a session of
    its own, its output to ``log_path``; our ends of the pipe."""
    to_chromium, ours_out = os.pipe()  # we write, it reads (its fd 3)
    ours_in, from_chromium = os.pipe()  # it writes (its fd 4), we read
    # Above 9, so that moving them to 3 and 4 in the shell cannot overwrite one of them.
    to_chromium, from_chromium = (_high(fd) for fd in (to_chromium, from_chromium))
    shell = f'exec "$@" 3<&{to_chromium} 4>&{from_chromium}'
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            ["/bin/bash", "-c", shell, "bash", *argv],  # dash takes no fd above 9
            pass_fds=(to_chromium, from_chromium),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
    os.close(to_chromium)
    os.close(from_chromium)
    return process, Pipe(ours_out, ours_in, timeout_s)


def _high(fd: int) -> int:
    high = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
    os.close(fd)
    return high


@dataclass
class Browser:
    """A headless Chromium process and its one page."""

    process: subprocess.Popen[bytes]
    pipe: Pipe
    page: Page

    @classmethod
    def launch(
        cls,
        home: str,
        chromium: str | None = None,
        width: int = 1024,
        height: int = 768,
        timeout_s: float = 30.0,
    ) -> Browser:
        """Start Chromium with its profile under ``home`` and open one blank page."""
        argv = [
            find_chromium(chromium),
            *CHROMIUM_FLAGS,
            f"--user-data-dir={os.path.join(home, 'chromium-profile')}",
            f"--window-size={width},{height}",
            "--remote-debugging-pipe",
            "about:blank",
        ]
        log = os.path.join(home, "chromium.log")
        process, pipe = _spawn(argv, log, timeout_s)
        try:
            target = pipe.call("Target.createTarget", url="about:blank")["targetId"]
            session = pipe.call("Target.attachToTarget", targetId=target, flatten=True)
        except BrowserError as exc:
            cls(process, pipe, Page(pipe, "")).close()  # no page: stop the process, close the pipe
            raise BrowserError(f"{exc}; see {log}") from exc
        page = Page(pipe, str(session["sessionId"]))
        for domain in ("Page", "DOM", "Accessibility", "Runtime"):
            page.call(f"{domain}.enable")
        page.call(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=False,
        )
        return cls(process, pipe, page)

    def close(self) -> None:
        with contextlib.suppress(BrowserError, OSError):
            self.pipe.call("Browser.close")
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)  # its own session: every process of it
            self.process.wait()
        for fd in (self.pipe.write_fd, self.pipe.read_fd):
            with contextlib.suppress(OSError):
                os.close(fd)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
