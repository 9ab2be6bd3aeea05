#!/usr/bin/env bash
# Reference solution of echo-python.
set -euo pipefail
echo python > answer.txt
