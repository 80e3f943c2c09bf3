"""`python -m kjit ...` is the `kjit` command."""
from .cli.main import main

main()
