#!/usr/bin/env bash
# Verifier of run-as-user: reward 1 if port.txt holds the port of service.ini and was written by
# the image's user "worker" (uid 1000), as the Dockerfile's USER says; else 0.
set -u
mkdir -p /logs/verifier
dir=/home/worker/service
reward=0
if [ -f "$dir/port.txt" ] && [ "$(tr -d '[:space:]' < "$dir/port.txt")" = "8125" ] \
  && [ "$(stat -c %u "$dir/port.txt")" = "1000" ] && [ "$(id -un)" = "worker" ]; then
  reward=1
fi
echo "$reward" > /logs/verifier/reward.txt
echo "reward: $reward (verifier ran as $(id -un))"
