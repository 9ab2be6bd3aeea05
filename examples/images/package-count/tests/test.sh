#!/usr/bin/env bash
# Verifier of package-count: compares with the base image's own package database and
# /etc/os-release (the files of debian:bookworm-slim, not of the machine that runs it).
set -u
mkdir -p /logs/verifier
expected=$(dpkg-query -W -f '${Package}\n' | wc -l)
. /etc/os-release
reward=0
if [ -f /srv/packages.txt ] && [ "$(tr -d '[:space:]' < /srv/packages.txt)" = "$expected" ] \
  && [ -f /srv/codename.txt ] && [ "$(tr -d '[:space:]' < /srv/codename.txt)" = "$VERSION_CODENAME" ]; then
  reward=1
fi
echo "$reward" > /logs/verifier/reward.txt
echo "reward: $reward (expected $expected packages, $VERSION_CODENAME)"
