"""OpenForge pipeline."""
