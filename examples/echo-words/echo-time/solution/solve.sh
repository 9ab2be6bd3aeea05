#!/usr/bin/env bash
# Reference solution of echo-time.
set -euo pipefail
echo time > answer.txt
