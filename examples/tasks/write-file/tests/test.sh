#!/usr/bin/env bash
# Verifier of write-file: reward 1 if /app/hello.txt holds exactly the line
# "hello from openforge" (with or without a final newline), else 0.
set -u
mkdir -p /logs/verifier
reward=0
if [ -f /app/hello.txt ] && [ "$(cat /app/hello.txt)" = "hello from openforge" ] \
  && [ "$(wc -l < /app/hello.txt)" -le 1 ]; then
  reward=1
fi
echo "$reward" > /logs/verifier/reward.txt
echo "reward: $reward"
