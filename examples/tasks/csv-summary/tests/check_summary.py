"""Checker of csv-summary: compares the agent's summary with one computed from the pristine
CSV and writes reward.json: the fraction of the four fields that are right, and the counts.

    python3 check_summary.py SUMMARY_JSON SALES_CSV REWARD_JSON
"""

import csv
import json
import math
import sys
from collections import Counter, defaultdict

FIELDS = ("total_units", "total_revenue", "revenue_by_region", "top_product")


def expected(csv_path):
    units = Counter()
    by_region = defaultdict(float)
    total_units, total_revenue = 0, 0.0
    with open(csv_path, newline="") as f:
        for row in csv.DictReader(f):
            n, price = int(row["units"]), float(row["unit_price"])
            total_units += n
            total_revenue += n * price
            by_region[row["region"]] += n * price
            units[row["product"]] += n
    return {
        "total_units": total_units,
        "total_revenue": round(total_revenue, 2),
        "revenue_by_region": {k: round(v, 2) for k, v in by_region.items()},
        "top_product": units.most_common(1)[0][0],
    }


def close(a, b):
    ok = isinstance(a, (int, float)) and not isinstance(a, bool)
    return ok and math.isclose(a, b, abs_tol=0.005)


def field_right(name, got, want):
    if name == "total_units":
        return isinstance(got, int) and not isinstance(got, bool) and got == want
    if name == "total_revenue":
        return close(got, want)
    if name == "revenue_by_region":
        return (
            isinstance(got, dict)
            and set(got) == set(want)
            and all(close(got[k], want[k]) for k in want)
        )
    return got == want


def main(summary_path, csv_path, reward_path):
    want = expected(csv_path)
    try:
        with open(summary_path) as f:
            got = json.load(f)
    except (OSError, ValueError) as exc:
        print(f"no readable summary: {exc}")
        got = None
    right = 0
    if isinstance(got, dict):
        for name in FIELDS:
            ok = field_right(name, got.get(name), want[name])
            print(f"{name}: {'ok' if ok else 'wrong'} (got {got.get(name)!r}, want {want[name]!r})")
            right += ok
    reward = {"reward": right / len(FIELDS), "fields_right": right, "fields_total": len(FIELDS)}
    with open(reward_path, "w") as f:
        json.dump(reward, f)
    print(json.dumps(reward))


if __name__ == "__main__":
    main(*sys.argv[1:4])
