#!/usr/bin/env bash
# Verifier of notes-service: reward 1 if the service (running again here: the image's
# ENTRYPOINT started it) lists exactly one note, "ship it", else 0.
set -u
mkdir -p /logs/verifier
reward=0
if python3 - <<'PY'
import json, sys, urllib.request
notes = json.loads(urllib.request.urlopen("http://127.0.0.1:8080/notes", timeout=10).read())
sys.exit(0 if notes == [{"text": "ship it"}] else 1)
PY
then reward=1; fi
echo "$reward" > /logs/verifier/reward.txt
echo "reward: $reward"
