"""SQL over a run's archive: DuckDB views of completions, tokens, rollouts, rewards, episodes,
samples, forks and the trainer's steps (``openforge query``; the views are in ``catalog.py``)."""
