#!/usr/bin/env bash
# Reference solution of echo-file.
set -euo pipefail
echo file > answer.txt
