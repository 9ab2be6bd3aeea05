#!/usr/bin/env bash
# Reference solution of echo-look.
set -euo pipefail
echo look > answer.txt
