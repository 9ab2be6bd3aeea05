"""newsletter-signup: ada@example.org, and only that address, is subscribed."""

import json
import sys
from pathlib import Path

state = json.loads(Path("/app/data/state.json").read_text())
sys.exit(0 if state["subscribers"] == ["ada@example.org"] else 1)
