"""flight-booking: one booking, of OF103 (the cheapest direct Lisbon-Oslo flight on 2027-03-14),
for Alan Turing."""

import json
import sys
from pathlib import Path

bookings = json.loads(Path("/app/data/state.json").read_text())["bookings"]
ok = bookings == [{"flight": "OF103", "passenger": "Alan Turing"}]
sys.exit(0 if ok else 1)
