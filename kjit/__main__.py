"""`python -m kjit ...` is the `kjit` command."""
from .cli import run

run()
