#!/usr/bin/env bash
# Reference solution of echo-data.
set -euo pipefail
echo data > answer.txt
