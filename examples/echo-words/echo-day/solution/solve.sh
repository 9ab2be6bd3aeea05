#!/usr/bin/env bash
# Reference solution of echo-day.
set -euo pipefail
echo day > answer.txt
