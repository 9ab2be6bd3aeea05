#!/usr/bin/env bash
# Reference solution of echo-part.
set -euo pipefail
echo part > answer.txt
