"""The `kjit` command line: a click group whose subcommands load on demand."""
