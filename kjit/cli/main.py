"""The `kjit` group. Each subcommand lives in its own module and is imported only when run."""
from __future__ import annotations

import importlib
import importlib.util
import sys

import click

from . import failures
from .._version import __version__

# command name -> "module:attribute"
COMMANDS = {
    "compile": "kjit.cli.compile:compile_cmd",
    "info": "kjit.cli.info:info_cmd",
    "link": "kjit.cli.link:link_cmd",
    "build": "kjit.cli.build:build_cmd",
    "inspect": "kjit.cli.inspect:inspect_cmd",
    "cache": "kjit.cli.cache:cache_group",
    "tune": "kjit.cli.tune:tune_group",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(name for name in COMMANDS if _importable(COMMANDS[name]))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        target = COMMANDS.get(name)
        if target is None or not _importable(target):
            return None
        module, attr = target.split(":")
        return getattr(importlib.import_module(module), attr)

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        """click's main, with every failure reported the one kjit way (cli/failures.py):
        a message, or with --json one JSON object on stdout, and a documented exit code."""
        args = list(sys.argv[1:] if args is None else args)
        with failures.warnings_as_messages():
            try:
                rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
            except SystemExit:
                raise
            except BaseException as exc:  # every way out is reported: none is a bare traceback
                if not standalone_mode:
                    raise
                code = failures.report(exc, failures.wants_json(args))
            else:
                code = None
        if code is not None:
            sys.exit(code)
        if not standalone_mode:
            return rv
        sys.exit(rv if isinstance(rv, int) else 0)  # an int is click's Exit code (--help)


def _importable(target: str) -> bool:
    return importlib.util.find_spec(target.split(":")[0]) is not None


@click.group(cls=LazyGroup)
@click.version_option(__version__, prog_name="kjit")
def cli() -> None:
    """kjit: compile, link, cache, build and inspect CUDA and HIP kernels."""


def main() -> None:
    cli.main()


if __name__ == "__main__":
    main()
