"""Every path a user gives on the command line is made absolute once, at the edge.

Relative paths mean the working directory the command was typed in, as in any shell tool;
nothing below the CLI sees a relative path (a sandbox's mount points, a run directory handed to
a subprocess with another working directory, a log URL written into a config file):

- ``Path`` options and arguments are declared with ``resolve_path=True`` (defaults included);
- event-log and archive locations given as text (``local:DIR``, ``archive:DIR``, a plain
  directory; ``kafka://...`` stays as it is) with ``parser=absolute_location``.

``tests/openforge/cli/test_paths.py`` checks that every command declares them so. Paths inside a
train config are made absolute against the config file's directory, ``--set`` values and
defaults against the working directory (``openforge.train.config.load_config``).
"""

from __future__ import annotations

from infra.eventlog.urls import absolute_location as _absolute


def absolute_location(text: str) -> str:
    """``text`` (an event log, an archive or a directory) absolute against the working
    directory."""
    return _absolute(text)
