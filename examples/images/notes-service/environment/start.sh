#!/bin/sh
# Start the notes service, wait until it listens, then run the command given.
set -e
ready="${TMPDIR:-/tmp}/notes.ready"
rm -f "$ready"
NOTES_READY="$ready" python3 /srv/notes.py >> /srv/notes.log 2>&1 &
i=0
until [ -f "$ready" ]; do
  i=$((i + 1))
  if [ "$i" -gt 200 ]; then echo "the notes service did not start; see /srv/notes.log" >&2; exit 1; fi
  sleep 0.05
done
exec "$@"
