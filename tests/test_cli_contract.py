"""docs/cli.md's exit codes hold for every `kjit` command, found by walking the click tree (a
command added later is checked without a test of its own), and every command is on that page.

Success is 0, a wrong command line 2 (an unknown option, a missing argument, a bad option
value), a failure 1, a bug 70 with its traceback, an interrupt 130 with one line; with
--json each failure is one JSON object on stdout naming its type and code.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from kjit.cli.main import cli
from kjit.errors import KjitError

DOC = (Path(__file__).resolve().parent.parent / "docs" / "cli.md").read_text()


def _leaves() -> list[tuple[tuple[str, ...], click.Command]]:
    ctx = click.Context(cli)
    found = []

    def walk(group: click.Group, path: tuple[str, ...]) -> None:
        for name in group.list_commands(ctx):
            cmd = group.get_command(ctx, name)
            if isinstance(cmd, click.Group):
                walk(cmd, path + (name,))
            else:
                found.append((path + (name,), cmd))
    walk(cli, ())
    return found


LEAVES = _leaves()
IDS = [" ".join(p) for p, _ in LEAVES]


def invoke(args):
    return CliRunner().invoke(cli, list(args))


@pytest.fixture
def a_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "k.cu").write_text('extern "C" __global__ void k(int* p) { p[0] = 1; }\n')
    return "k.cu"


def required_args(cmd: click.Command, a_file: str) -> list[str]:
    """A value for each required argument that parses: the one existing file."""
    return [a_file for p in cmd.params if isinstance(p, click.Argument) and p.required]


def test_the_tree_has_every_command_and_the_page_names_each():
    top = {p[0] for p, _ in LEAVES}
    assert top == {"compile", "build", "link", "inspect", "info", "cache", "tune"}
    assert len(LEAVES) >= 17
    synopsis = re.search(r"`kjit ([^`]+)`", DOC).group(1)   # `kjit compile | build | ...`
    assert {w.strip(" .") for w in synopsis.split("|")} == top
    for path, _ in LEAVES:
        if len(path) == 1:
            continue
        section = DOC.split(f"## `kjit {path[0]}`", 1)[1].split("\n## ", 1)[0]
        assert re.search(rf"\|[^|\n]*`{re.escape(path[1])}\b", section), \
            f"kjit {' '.join(path)} is not in the table of docs/cli.md's `kjit {path[0]}` section"


def test_the_page_documents_the_codes_tested_here():
    table = DOC.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    assert {int(c) for c in re.findall(r"^\| (\d+) \|", table, re.M)} == {0, 1, 2, 70, 130}


def test_the_group_itself():
    assert invoke(["--help"]).exit_code == 0
    assert invoke(["--version"]).exit_code == 0
    r = invoke(["no-such-command"])
    assert r.exit_code == 2 and "No such command" in r.output
    r = invoke(["no-such-command", "--json"])
    assert r.exit_code == 2 and json.loads(r.stdout)["error"]["type"] == "UsageError"


@pytest.mark.parametrize("path,cmd", LEAVES, ids=IDS)
def test_help_is_0(path, cmd):
    r = invoke([*path, "--help"])
    assert r.exit_code == 0 and r.stdout.startswith("Usage:"), r.output


@pytest.mark.parametrize("path,cmd", LEAVES, ids=IDS)
def test_an_unknown_option_is_2(path, cmd, a_file):
    args = [*path, *required_args(cmd, a_file), "--no-such-option"]
    r = invoke(args)
    assert r.exit_code == 2 and "No such option '--no-such-option'" in r.stderr, r.output
    assert r.stdout == ""
    r = invoke([*args, "--json"])
    assert r.exit_code == 2, r.output
    error = json.loads(r.stdout)["error"]
    assert (error["type"], error["exit_code"]) == ("UsageError", 2)


@pytest.mark.parametrize("path,cmd", [(p, c) for p, c in LEAVES if required_args(c, "x")],
                         ids=[i for i, (p, c) in zip(IDS, LEAVES) if required_args(c, "x")])
def test_a_missing_argument_is_2(path, cmd):
    r = invoke(path)
    assert r.exit_code == 2 and "Missing argument" in r.stderr, r.output


def _bad_values(cmd: click.Command):
    """(option, a value its type refuses) for each option that takes a typed value."""
    for p in cmd.params:
        if not isinstance(p, click.Option) or p.is_flag or p.count:
            continue
        if isinstance(p.type, click.Choice):
            yield p.opts[0], "no-such-choice"
        elif isinstance(p.type, (click.types.IntParamType, click.types.FloatParamType)):
            yield p.opts[0], "not-a-number"


TYPED = [(p, c, o, v) for p, c in LEAVES for o, v in _bad_values(c)]


@pytest.mark.parametrize("path,cmd,option,value", TYPED,
                         ids=[f"{' '.join(p)} {o}" for p, _, o, _ in TYPED])
def test_a_bad_option_value_is_2(path, cmd, option, value, a_file):
    r = invoke([*path, *required_args(cmd, a_file), option, value])
    assert r.exit_code == 2 and "Invalid value" in r.stderr, r.output


OUTCOMES = {   # what the command's body raises -> exit code, the --json type, on stderr
    "failure": (lambda: KjitError("it failed"), 1, "KjitError", "error: it failed"),
    "bug": (lambda: RuntimeError("a bug"), 70, "InternalError", "Traceback"),
    "interrupt": (lambda: KeyboardInterrupt(), 130, "Interrupted", "error: interrupted"),
}


@pytest.mark.parametrize("outcome", sorted(OUTCOMES))
@pytest.mark.parametrize("path,cmd", LEAVES, ids=IDS)
def test_every_way_out_has_its_code(path, cmd, outcome, a_file, monkeypatch):
    make, code, kind, said = OUTCOMES[outcome]

    def body(**_):
        raise make()
    monkeypatch.setattr(cmd, "callback", body)
    args = [*path, *required_args(cmd, a_file)]
    r = invoke(args)
    assert r.exit_code == code and said in r.stderr and r.stdout == "", r.output
    if outcome != "bug":
        assert "Traceback" not in r.output
    r = invoke([*args, "--json"])
    error = json.loads(r.stdout)["error"]
    assert r.exit_code == code and (error["type"], error["exit_code"]) == (kind, code)


@pytest.mark.parametrize("path,cmd", LEAVES, ids=IDS)
def test_success_is_0(path, cmd, a_file, monkeypatch):
    monkeypatch.setattr(cmd, "callback", lambda **_: None)
    assert invoke([*path, *required_args(cmd, a_file)]).exit_code == 0
