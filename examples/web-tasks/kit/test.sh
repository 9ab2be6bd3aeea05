#!/usr/bin/env bash
# The verifier: reward 1 if the app's state (/app/data/state.json, written by the app, never by
# the agent) shows the task done (tests/check.py), else 0.
set -u
mkdir -p /logs/verifier
reward=0
if python3 /tests/check.py; then reward=1; fi
echo "$reward" > /logs/verifier/reward.txt
echo "reward: $reward"
