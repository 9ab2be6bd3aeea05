"""Small statistics helpers over lists of numbers."""

from textstats.stats import mean, median, spread

__all__ = ["mean", "median", "spread"]
