"""OpenForge trainer."""
