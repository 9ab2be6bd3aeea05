#!/usr/bin/env bash
# Verifier of fix-failing-test: runs the package's test suite with the standard library's
# unittest and writes reward 1 if every test passes, else 0. The tests run are the pristine
# copy in /tests (the same file as /app/tests/test_stats.py), so editing the tests in /app
# does not help.
set -u
mkdir -p /logs/verifier
cd /app || { echo 0 > /logs/verifier/reward.txt; exit 0; }
if PYTHONPATH=/app python3 -m unittest discover -s /tests -t /tests -p 'test_*.py' -v; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
