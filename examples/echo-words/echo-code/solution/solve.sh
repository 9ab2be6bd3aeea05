#!/usr/bin/env bash
# Reference solution of echo-code.
set -euo pipefail
echo code > answer.txt
