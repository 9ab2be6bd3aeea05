"""Work again on a recorded run: re-score it with a changed verifier, retrain on it."""
