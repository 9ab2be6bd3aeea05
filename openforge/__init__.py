"""OpenForge's application layer: the ``openforge`` command line and the runs that wire the
packages below it (``proxy``, ``pipeline``, ``trainer`` on ``infra`` on ``schemas``) together.

Nothing below this package imports it; ``bench`` and ``tests`` build on it.
"""
