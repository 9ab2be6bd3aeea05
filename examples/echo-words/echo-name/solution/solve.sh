#!/usr/bin/env bash
# Reference solution of echo-name.
set -euo pipefail
echo name > answer.txt
