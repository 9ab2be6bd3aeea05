#!/usr/bin/env bash
# Reference solution of echo-water.
set -euo pipefail
echo water > answer.txt
