#!/usr/bin/env bash
# Verifier of sqlite-report: needs the image's sqlite3 and jq (installed by its Dockerfile with
# apt-get). Reward 1 if /app/report.json holds every customer's total, else 0.
set -u
mkdir -p /logs/verifier
reward=0
expected=$(sqlite3 -json /app/shop.db \
  "SELECT c.name, COALESCE(SUM(o.amount_cents), 0) AS total
   FROM customers c LEFT JOIN orders o ON o.customer_id = c.id GROUP BY c.id" \
  | jq -S 'map({(.name): .total}) | add')
if [ -f /app/report.json ] && got=$(jq -S . /app/report.json 2>/dev/null) \
  && [ -n "$expected" ] && [ "$got" = "$expected" ]; then
  reward=1
fi
echo "$reward" > /logs/verifier/reward.txt
echo "reward: $reward"
