#!/usr/bin/env bash
# Reference solution of echo-made.
set -euo pipefail
echo made > answer.txt
