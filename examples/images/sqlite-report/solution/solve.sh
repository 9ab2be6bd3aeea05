#!/usr/bin/env bash
# Reference solution of sqlite-report: the sqlite3 and jq the image installs do the work.
set -euo pipefail
sqlite3 -json /app/shop.db \
  "SELECT c.name, COALESCE(SUM(o.amount_cents), 0) AS total
   FROM customers c LEFT JOIN orders o ON o.customer_id = c.id GROUP BY c.id" \
  | jq 'map({(.name): .total}) | add' > /app/report.json
cat /app/report.json
