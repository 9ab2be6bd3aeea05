"""Work again on a recorded run: rebuild its episodes with the current code, re-score it with a
changed verifier, retrain on it."""
