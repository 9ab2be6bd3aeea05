"""``python -m openforge``: the same as the ``openforge`` console script."""

from openforge.cli import main

main()
