#!/usr/bin/env bash
# Reference solution of echo-list.
set -euo pipefail
echo list > answer.txt
