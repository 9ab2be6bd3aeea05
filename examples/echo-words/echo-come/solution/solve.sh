#!/usr/bin/env bash
# Reference solution of echo-come.
set -euo pipefail
echo come > answer.txt
