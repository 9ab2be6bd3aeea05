#!/bin/sh
# The image's ENTRYPOINT: start the task's web app, wait until it listens, then run the command
# given (the agent's harness, the verifier). The app keeps its state in /app/data.
set -e
export APP_READY="${TMPDIR:-/tmp}/app.ready"
rm -f "$APP_READY"
mkdir -p /app/data
python3 /app/app.py >> /app/data/app.log 2>&1 &
i=0
until [ -f "$APP_READY" ]; do
  i=$((i + 1))
  if [ "$i" -gt 200 ]; then echo "the task's app did not start; see /app/data/app.log" >&2; exit 1; fi
  sleep 0.05
done
exec "$@"
