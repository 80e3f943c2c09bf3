"""The `kjit` command line: a click group whose subcommands load on demand. `run()` runs it
with the process's arguments (the `kjit` script and `python -m kjit`)."""
from ..lazy import lazy_names

__getattr__ = lazy_names(__name__, {"run": "main:main"})
