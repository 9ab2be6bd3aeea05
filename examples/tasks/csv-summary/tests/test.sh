#!/usr/bin/env bash
# Verifier of csv-summary: checks /app/summary.json against the pristine CSV in /tests and
# writes /logs/verifier/reward.json ({"reward": fraction of the 4 fields right, ...}). If the
# checker itself fails, reward.txt says 0.
set -u
mkdir -p /logs/verifier
rm -f /logs/verifier/reward.json
if ! python3 /tests/check_summary.py /app/summary.json /tests/sales.csv /logs/verifier/reward.json; then
  echo 0 > /logs/verifier/reward.txt
fi
