#!/usr/bin/env bash
# Reference solution of csv-summary; runs in the workspace (/app).
set -euo pipefail
python3 - <<'PY'
import csv
import json
from collections import Counter, defaultdict

units = Counter()
by_region = defaultdict(float)
total_units, total_revenue = 0, 0.0
with open("data/sales.csv", newline="") as f:
    for row in csv.DictReader(f):
        n, price = int(row["units"]), float(row["unit_price"])
        total_units += n
        total_revenue += n * price
        by_region[row["region"]] += n * price
        units[row["product"]] += n
summary = {
    "total_units": total_units,
    "total_revenue": round(total_revenue, 2),
    "revenue_by_region": {k: round(v, 2) for k, v in sorted(by_region.items())},
    "top_product": units.most_common(1)[0][0],
}
with open("summary.json", "w") as f:
    json.dump(summary, f, indent=2)
print(json.dumps(summary))
PY
