"""OpenForge infra/local."""
