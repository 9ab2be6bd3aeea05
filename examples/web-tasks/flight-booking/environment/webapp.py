"""A small web app on Python's standard library: pages, forms, a cookie session and a JSON state
file that the task's verifier reads after the agent (the app's only database).

A task's ``app.py`` makes an :class:`App`, adds its pages with ``@app.get(path)`` and
``@app.post(path)`` (a handler takes the :class:`Request` and returns HTML, or a
:class:`Redirect`) and calls ``app.run()``. Only POST changes the state, so a page that is
merely opened changes nothing. Served on 127.0.0.1:$APP_PORT (default 8765).
"""

from __future__ import annotations

import html
import json
import os
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.cookies import SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

PORT = int(os.environ.get("APP_PORT", "8765"))
STATE = Path(os.environ.get("APP_STATE", "/app/data/state.json"))
READY = Path(os.environ.get("APP_READY", "/tmp/app.ready"))


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def page(title: str, body: str) -> str:
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{esc(title)}</title>"
        "<style>body{font-family:sans-serif;margin:2em;max-width:40em}label{display:block;"
        "margin:.5em 0}table{border-collapse:collapse}td,th{border:1px solid #999;padding:.3em}"
        f"</style></head><body>{body}</body></html>"
    )


@dataclass
class Redirect:
    location: str


@dataclass
class Request:
    path: str
    query: dict[str, str]
    form: dict[str, str]
    session: dict[str, Any]


@dataclass
class App:
    title: str
    initial: dict[str, Any] = field(default_factory=dict)
    routes: dict[tuple[str, str], Callable[[Request], str | Redirect]] = field(default_factory=dict)
    sessions: dict[str, dict[str, Any]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self, path: str) -> Callable[[Callable[[Request], str | Redirect]], Any]:
        return lambda f: self.routes.setdefault(("GET", path), f)

    def post(self, path: str) -> Callable[[Callable[[Request], str | Redirect]], Any]:
        return lambda f: self.routes.setdefault(("POST", path), f)

    def load(self) -> dict[str, Any]:
        if STATE.exists():
            return dict(json.loads(STATE.read_text()))
        return json.loads(json.dumps(self.initial))

    def save(self, state: dict[str, Any]) -> None:
        STATE.parent.mkdir(parents=True, exist_ok=True)
        tmp = STATE.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=1, sort_keys=True))
        tmp.replace(STATE)

    def run(self) -> None:
        if not STATE.exists():
            self.save(self.load())
        server = ThreadingHTTPServer(("127.0.0.1", PORT), _handler(self))
        READY.write_text(str(PORT))
        server.serve_forever()


def _handler(app: App) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self._serve("GET", "")

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            self._serve("POST", self.rfile.read(length).decode("utf-8", "replace"))

        def _serve(self, method: str, body: str) -> None:
            url = urlsplit(self.path)
            route = app.routes.get((method, url.path))
            if route is None:
                self._send(404, page("Not found", "<h1>Not found</h1>"))
                return
            cookie = SimpleCookie(self.headers.get("Cookie") or "")
            sid = cookie["sid"].value if "sid" in cookie else ""
            new_sid = None if sid in app.sessions else secrets.token_hex(8)
            session = app.sessions.setdefault(new_sid or sid, {})
            request = Request(url.path, _flat(url.query), _flat(body), session)
            with app.lock:
                answer = route(request)
            headers = {"Set-Cookie": f"sid={new_sid}; Path=/; HttpOnly"} if new_sid else {}
            if isinstance(answer, Redirect):
                self._send(303, "", {**headers, "Location": answer.location})
            else:
                self._send(200, answer, headers)

        def _send(self, status: int, text: str, headers: dict[str, str] | None = None) -> None:
            data = text.encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            print(f"{self.command} {self.path} -> {args[1] if len(args) > 1 else ''}", flush=True)

    return Handler


def _flat(query: str) -> dict[str, str]:
    return {k: v[-1] for k, v in parse_qs(query, keep_blank_values=True).items()}
