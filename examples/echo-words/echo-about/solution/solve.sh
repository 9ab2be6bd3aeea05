#!/usr/bin/env bash
# Reference solution of echo-about.
set -euo pipefail
echo about > answer.txt
