#!/usr/bin/env bash
# Reference solution of package-count: read the base image's own package database.
set -euo pipefail
dpkg-query -W -f '${Package}\n' | wc -l > /srv/packages.txt
. /etc/os-release
echo "$VERSION_CODENAME" > /srv/codename.txt
cat /srv/packages.txt /srv/codename.txt
