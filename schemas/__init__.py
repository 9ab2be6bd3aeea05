"""OpenForge schemas."""
