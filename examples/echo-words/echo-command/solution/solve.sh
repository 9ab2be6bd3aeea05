#!/usr/bin/env bash
# Reference solution of echo-command.
set -euo pipefail
echo command > answer.txt
