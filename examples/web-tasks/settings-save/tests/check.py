"""settings-save: the saved theme is Dark and notifications are off."""

import json
import sys
from pathlib import Path

state = json.loads(Path("/app/data/state.json").read_text())
ok = state["theme"] == "Dark" and state["notifications"] is False and state["saves"] >= 1
sys.exit(0 if ok else 1)
