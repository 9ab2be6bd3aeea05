#!/bin/bash
# Harbor's usual verifier: pytest with the CTRF report, reward 1 if every test passes.
cd /app || exit 1
pytest /tests/test_outputs.py -rA --ctrf /logs/verifier/ctrf.json
if [ $? -eq 0 ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
