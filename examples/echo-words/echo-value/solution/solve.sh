#!/usr/bin/env bash
# Reference solution of echo-value.
set -euo pipefail
echo value > answer.txt
