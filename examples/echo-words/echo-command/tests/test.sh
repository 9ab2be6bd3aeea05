#!/usr/bin/env bash
# Verifier of echo-command: reward 1 if /app/answer.txt holds exactly the word "command", else 0.
set -u
mkdir -p /logs/verifier
reward=0
if [ -f /app/answer.txt ] && [ "$(tr -d '[:space:]' < /app/answer.txt)" = "command" ]; then
  reward=1
fi
echo "$reward" > /logs/verifier/reward.txt
echo "reward: $reward"
