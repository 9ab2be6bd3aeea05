"""A notes service: POST /notes {"text": ...} adds a note, GET /notes lists them; the notes are
kept in /srv/data/notes.json."""

import json
import os
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

NOTES = Path("/srv/data/notes.json")


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self._answer(200, json.loads(NOTES.read_text()) if NOTES.exists() else [])

    def do_POST(self) -> None:
        if self.path != "/notes":
            self._answer(404, {"error": "POST /notes"})
            return
        try:
            text = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["text"]
        except (KeyError, TypeError, ValueError):
            self._answer(400, {"error": 'send {"text": "..."}'})
            return
        notes = json.loads(NOTES.read_text()) if NOTES.exists() else []
        notes.append({"text": str(text)})
        NOTES.parent.mkdir(parents=True, exist_ok=True)
        NOTES.write_text(json.dumps(notes))
        self._answer(201, notes[-1])

    def _answer(self, status: int, value: object) -> None:
        data = json.dumps(value).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


server = HTTPServer(("127.0.0.1", 8080), Handler)
Path(os.environ["NOTES_READY"]).write_text("8080")
server.serve_forever()
