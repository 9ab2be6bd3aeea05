"""profile-login: grace's display name is Amazing Grace, and nobody else's changed."""

import json
import sys
from pathlib import Path

users = json.loads(Path("/app/data/state.json").read_text())["users"]
ok = (
    users["grace"]["display_name"] == "Amazing Grace" and users["alan"]["display_name"] == "Alan T."
)
sys.exit(0 if ok else 1)
