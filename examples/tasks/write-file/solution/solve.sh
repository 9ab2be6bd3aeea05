#!/usr/bin/env bash
# Reference solution of write-file; runs in the workspace (/app).
set -euo pipefail
printf 'hello from openforge\n' > hello.txt
echo "wrote $(pwd)/hello.txt"
