#!/usr/bin/env bash
# Reference solution of echo-read.
set -euo pipefail
echo read > answer.txt
