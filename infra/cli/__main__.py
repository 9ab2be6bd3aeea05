"""``python -m infra.cli``: the same as the ``openforge`` console script."""

from infra.cli import main

main()
