#!/usr/bin/env bash
# Reference solution of echo-first.
set -euo pipefail
echo first > answer.txt
