"""Offline replay of a run's archive: rebuild its episodes with the current code."""
