"""The API dialects harnesses speak, one module each, behind the :class:`~proxy.dialects.base.
Dialect` protocol; :data:`proxy.dialects.registry.DIALECTS` holds them by name."""
