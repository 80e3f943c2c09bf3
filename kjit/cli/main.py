"""The `kjit` group. Each subcommand lives in its own module and is imported only when run."""
from __future__ import annotations

import importlib
import importlib.util

import click

from .._version import __version__
from ..errors import KjitError

# command name -> "module:attribute"
COMMANDS = {
    "compile": "kjit.cli.compile:compile_cmd",
    "info": "kjit.cli.info:info_cmd",
    "link": "kjit.cli.link:link_cmd",
    "build": "kjit.cli.build:build_cmd",
    "inspect": "kjit.cli.inspect:inspect_cmd",
    "cache": "kjit.cli.cache:cache_group",
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


def _importable(target: str) -> bool:
    return importlib.util.find_spec(target.split(":")[0]) is not None


@click.group(cls=LazyGroup)
@click.version_option(__version__, prog_name="kjit")
def cli() -> None:
    """kjit: compile, link, cache, build and inspect CUDA and HIP kernels."""


def main() -> None:
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        raise SystemExit(1)
    except click.ClickException as exc:
        exc.show()
        raise SystemExit(exc.exit_code)
    except KjitError as exc:  # a clear message, not a traceback
        click.echo(f"error: {exc}", err=True)
        raise SystemExit(1)
    except SystemExit:
        raise


if __name__ == "__main__":
    main()
