"""The services of streaming training from live traffic, run apart: the proxy in open mode, the
pipeline job and the trainer, each its own long-lived process on one event log."""
