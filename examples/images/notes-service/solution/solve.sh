#!/usr/bin/env bash
# Reference solution of notes-service: one POST to the running service.
set -euo pipefail
python3 - <<'PY'
import json, urllib.request
request = urllib.request.Request(
    "http://127.0.0.1:8080/notes", data=json.dumps({"text": "ship it"}).encode(),
    headers={"Content-Type": "application/json"}, method="POST",
)
print(urllib.request.urlopen(request, timeout=10).read().decode())
PY
