#!/usr/bin/env bash
# Reference solution of run-as-user: runs as the image's user, in its WORKDIR.
set -euo pipefail
sed -n 's/^port *= *//p' service.ini > port.txt
cat port.txt
