"""OpenForge infra."""
