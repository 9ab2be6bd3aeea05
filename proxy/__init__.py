"""OpenForge proxy."""
