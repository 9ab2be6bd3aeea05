"""shop-order: exactly one order, of 2 Blue Mugs, to Ada Lovelace at 12 Analytical Street."""

import json
import sys
from pathlib import Path

orders = json.loads(Path("/app/data/state.json").read_text())["orders"]
ok = len(orders) == 1 and orders[0]["items"] == {"blue-mug": 2}
ok = ok and orders[0]["name"].casefold() == "ada lovelace"
ok = ok and orders[0]["address"].casefold().startswith("12 analytical st")
sys.exit(0 if ok else 1)
