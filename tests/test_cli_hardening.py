"""The command line with odd inputs and outputs (issue 16, defects 2, 3, 5 and 10):
sources that are not UTF-8 or hold a NUL, outputs that are FIFOs, links, /dev/null,
/dev/full or standard output, export/import mistakes, and --json failures."""
from __future__ import annotations

import json
import os
import stat
import threading
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

import kjit
from kjit.cli.main import cli

SRC = 'extern "C" __global__ void k(float* y) { y[threadIdx.x] = 1.0f; }\n'
ELF = b"\x7fELF"


def invoke(*args, input=None):
    return CliRunner().invoke(cli, [str(a) for a in args], input=input)


def json_error(res) -> dict:
    """The one JSON object a failing --json command prints on stdout."""
    assert res.exit_code != 0, res.output
    return json.loads(res.stdout)["error"]


@pytest.fixture
def src(tmp_path) -> Path:
    p = tmp_path / "k.cu"
    p.write_text(SRC)
    return p


# --- defect 2: sources that are not UTF-8 text ----------------------------------------------------
@pytest.mark.parametrize("cmd", ["compile", "build"])
def test_non_utf8_source_is_a_clear_error(tmp_path, cmd):
    bad = tmp_path / "latin1.cu"
    bad.write_bytes(SRC.encode() + "// caf\xe9\n".encode("latin-1"))
    res = invoke(cmd, bad, "--arch", "sm_90")
    assert res.exit_code == 1 and "Traceback" not in res.output
    offset = len(SRC.encode()) + len("// caf")
    assert f"{bad}: not UTF-8 text: byte 0xe9 at byte offset {offset} (line 2)" in res.output
    err = json_error(invoke(cmd, bad, "--arch", "sm_90", "--json"))
    assert err["type"] == "InvalidOptionError" and str(bad) in err["message"]


@pytest.mark.parametrize("cmd", ["compile", "build"])
def test_nul_byte_in_a_source_is_a_clear_error(tmp_path, cmd):
    bad = tmp_path / "nul.cu"
    bad.write_bytes(SRC.encode() + b"\0" + b"this would be dropped silently\n")
    res = invoke(cmd, bad, "--arch", "sm_90")
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert f"{bad}: NUL byte at byte offset {len(SRC)} (line 2)" in res.output
    assert not (tmp_path / "nul.cubin").exists() and not (tmp_path / "nul.fatbin").exists()


def test_nul_in_a_source_string_is_refused_by_compile():
    with pytest.raises(kjit.InvalidOptionError, match="NUL byte at byte offset 3"):
        kjit.compile("int\0 garbage", arch="sm_90", name="x.cu")
    with pytest.raises(kjit.InvalidOptionError, match="not UTF-8 text: byte 0xff"):
        kjit.compile(b"int \xff x;", arch="sm_90")


# --- defect 3: outputs --------------------------------------------------------------------------
def test_output_to_a_fifo_is_written_through(tmp_path, src):
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    res = invoke("compile", src, "--arch", "sm_90", "-o", fifo)
    reader.join(30)
    if reader.is_alive():  # kjit never opened the FIFO: unblock the reader, then fail
        with open(fifo, "wb"):
            pass
        pytest.fail(f"the FIFO's reader got nothing: {res.output}")
    assert res.exit_code == 0, res.output
    assert got[0].startswith(ELF) and stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.cu", "out.fifo"]  # no temp, no sidecar


def test_output_through_a_symlink_writes_its_target(tmp_path, src):
    target = tmp_path / "real" / "k.cubin"
    target.parent.mkdir()
    target.write_bytes(b"old")
    link = tmp_path / "link.cubin"
    link.symlink_to(target)
    res = invoke("compile", src, "--arch", "sm_90", "-o", link)
    assert res.exit_code == 0, res.output
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_bytes().startswith(ELF)
    dangling = tmp_path / "dangling.cubin"
    dangling.symlink_to(tmp_path / "real" / "new.cubin")
    assert invoke("compile", src, "--arch", "sm_90", "-o", dangling).exit_code == 0
    assert dangling.is_symlink() and (tmp_path / "real" / "new.cubin").read_bytes().startswith(ELF)


def test_output_to_stdout_for_a_pipe(src):
    res = invoke("compile", src, "--arch", "sm_90", "-o", "-")
    assert res.exit_code == 0 and res.stdout_bytes.startswith(ELF)
    assert "wrote <stdout>" in res.stderr
    assert kjit.ObjectCode(res.stdout_bytes).entry_points == ("k",)
    res = invoke("compile", src, "--arch", "sm_90", "-o", "-", "--json")
    assert res.exit_code == 2 and json_error(res)["type"] == "UsageError"


def test_link_and_build_write_to_stdout_too(tmp_path, src):
    ptx = tmp_path / "k.ptx"
    assert invoke("compile", src, "--arch", "sm_90", "--emit", "ptx", "-o", ptx).exit_code == 0
    res = invoke("link", ptx, "--arch", "sm_90", "-o", "-")
    assert res.exit_code == 0, res.output
    assert res.stdout_bytes.startswith(ELF)
    res = invoke("build", src, "--arch", "sm_90", "--no-ptx", "-o", "-")
    assert res.exit_code == 0, res.output
    assert res.stdout_bytes[:4] == b"\x50\xed\x55\xba" and "wrote -" in res.stderr


class _NodeGuard:
    """Fails the test at once if anything tries to rename over, replace or remove `node`
    (a character device), so a bug cannot break the machine's /dev/null or /dev/full."""

    def __init__(self, monkeypatch, node: str):
        self.node = os.path.realpath(node)
        for name in ("replace", "rename", "unlink", "remove"):
            real = getattr(os, name)
            monkeypatch.setattr(os, name, self._guard(real, name))

    def _guard(self, real, name):
        def guarded(*args, **kwargs):
            for a in args[:2]:
                if isinstance(a, (str, os.PathLike)) and os.path.realpath(a) == self.node:
                    raise AssertionError(f"os.{name} on {self.node}")
            return real(*args, **kwargs)
        return guarded


@pytest.mark.parametrize("node", ["/dev/null", "/dev/full"])
def test_device_nodes_are_written_through_never_replaced(src, monkeypatch, node):
    if not os.path.exists(node) or not stat.S_ISCHR(os.stat(node).st_mode):
        pytest.skip(f"{node} is not a character device here")
    from kjit import fileio
    assert fileio.destination(node) == (node, True)
    before = os.stat(node)
    _NodeGuard(monkeypatch, node)
    res = invoke("compile", src, "--arch", "sm_90", "-o", node)
    after = os.stat(node)
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev
    assert not os.path.exists(node + ".kjit.json") and not os.path.exists(node + ".tmp")
    if node == "/dev/null":
        assert res.exit_code == 0, res.output
    else:  # ENOSPC is reported, with exit 1
        assert res.exit_code == 1 and f"cannot write {node}: No space left on device" in res.output
        err = json_error(invoke("compile", src, "--arch", "sm_90", "-o", node, "--json"))
        assert err["type"] == "OutputError" and "No space left" in err["message"]


def test_write_error_leaves_the_old_output_and_no_temporary_file(tmp_path, src, monkeypatch):
    out = tmp_path / "k.cubin"
    out.write_bytes(b"previous build")
    import kjit.fileio as fileio

    class Full:
        def __init__(self, f):
            self.f = f

        def write(self, data):
            raise OSError(28, "No space left on device")

        def __getattr__(self, name):
            return getattr(self.f, name)

    real = fileio.open_output

    def failing(path):
        cm = real(path)

        class Wrap:
            def __enter__(self):
                return Full(cm.__enter__())

            def __exit__(self, *exc):
                return cm.__exit__(*exc)
        return Wrap()
    monkeypatch.setattr(fileio, "open_output", failing)
    res = invoke("compile", src, "--arch", "sm_90", "-o", out)
    assert res.exit_code == 1 and "No space left on device" in res.output
    assert out.read_bytes() == b"previous build"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.cu", "k.cubin"]


def test_output_naming_an_input_is_refused(tmp_path, src):
    for out in (src, tmp_path / "alias.cu"):
        if out != src:
            out.symlink_to(src)
        res = invoke("compile", src, "--arch", "sm_90", "-o", out)
        assert res.exit_code == 2 and "is one of the inputs" in res.output
        assert src.read_text() == SRC
    hard = tmp_path / "hard.cu"
    os.link(src, hard)
    res = invoke("build", src, "--arch", "sm_90", "-o", hard)
    assert res.exit_code == 2 and "is one of the inputs" in res.output and src.read_text() == SRC


def test_output_into_a_directory_is_an_error(tmp_path, src):
    res = invoke("compile", src, "--arch", "sm_90", "-o", tmp_path)
    assert res.exit_code == 2 and "Traceback" not in res.output


# --- defect 5: export and import mistakes ----------------------------------------------------------
def test_export_to_a_missing_directory_is_a_clear_error(tmp_path, src):
    invoke("compile", src, "--arch", "sm_90")
    res = invoke("cache", "export", "/nonexistent-kjit-dir/x.zip")
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert "cannot write /nonexistent-kjit-dir/x.zip: No such file or directory" in res.output


@pytest.mark.parametrize("manifest", ["[1, 2]", '"kjit"', "null", "{", '{"format": 7}'])
def test_import_of_a_bad_manifest_is_a_clear_error(tmp_path, manifest):
    z = tmp_path / "bad.zip"
    with zipfile.ZipFile(z, "w") as f:
        f.writestr("manifest.json", manifest)
    res = invoke("cache", "import", z)
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert "manifest" in res.output or "export format" in res.output
    assert json_error(invoke("cache", "import", z, "--json"))["type"] == "InvalidOptionError"


def test_export_to_stdout_imports_back(tmp_path, src, monkeypatch):
    invoke("compile", src, "--arch", "sm_90")
    res = invoke("cache", "export", "-")
    assert res.exit_code == 0 and "exported 1 entries" in res.stderr
    (tmp_path / "piped.zip").write_bytes(res.stdout_bytes)
    monkeypatch.setenv("KJIT_CACHE_DIR", str(tmp_path / "elsewhere"))
    assert json.loads(invoke("cache", "import", tmp_path / "piped.zip", "--json").stdout)["imported"] == 1


# --- defect 10: every failing command speaks JSON with --json --------------------------------------
def _failing_commands(tmp_path: Path, src: Path) -> dict[str, list]:
    bad_src = tmp_path / "bad.cu"
    bad_src.write_text("__global__ void k() { nope; }\n")
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"junk" * 10)
    return {
        "compile error": ["compile", bad_src, "--arch", "sm_90"],
        "compile missing file": ["compile", tmp_path / "absent.cu"],
        "compile bad option": ["compile", src, "--emit", "exe"],
        "build bad arch": ["build", src, "--arch", "sm_1"],
        "link junk": ["link", junk, "--arch", "sm_90", "-o", tmp_path / "o.cubin"],
        "inspect junk": ["inspect", junk],
        "cache show": ["cache", "show", "zz"],
        "cache import junk": ["cache", "import", junk],
        "cache prune nothing": ["cache", "prune"],
        "cache ls bad sort": ["cache", "ls", "--sort", "colour"],
    }


def test_every_failing_command_prints_one_json_error(tmp_path, src):
    for what, args in _failing_commands(tmp_path, src).items():
        res = invoke(*args, "--json")
        assert res.exit_code in (1, 2), (what, res.output)
        err = json_error(res)
        assert set(err) >= {"type", "message", "exit_code"} and err["message"], what
        assert err["exit_code"] == res.exit_code, what
        text = invoke(*args)
        assert text.exit_code == res.exit_code and text.stdout == "", (what, text.stdout)
    err = json_error(invoke("compile", tmp_path / "bad.cu", "--arch", "sm_90", "--json"))
    assert err["type"] == "CompileError" and "nope" in err["log"]
    err = json_error(invoke("inspect", tmp_path / "junk.bin", "--json"))
    assert str(tmp_path / "junk.bin") in err["message"]


def test_an_internal_error_is_reported_with_exit_70(monkeypatch):
    import kjit.cli.info as info

    def broken():
        raise RuntimeError("a bug")
    monkeypatch.setattr(info, "gather", broken)
    res = invoke("info", "--json")
    assert res.exit_code == 70
    err = json_error(res)
    assert err["type"] == "InternalError" and "RuntimeError: a bug" in err["message"]
    assert "Traceback" in res.stderr


# --- the contract: usage 2, failure 1, internal 70, interrupt 130, one JSON object --------------
ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args, env=None, **kw):
    """The real `kjit` in a fresh process (`python -m kjit.cli.main`)."""
    import subprocess
    import sys
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])), **(env or {}))
    return subprocess.run([sys.executable, "-m", "kjit.cli.main", *map(str, args)], env=env,
                          capture_output=True, text=True, timeout=300, **kw)


def _usage_errors(tmp_path: Path, src: Path) -> dict[str, list]:
    cubin = tmp_path / "k.cubin"
    cubin.write_bytes(ELF + b"\0" * 60)
    return {
        "compile bad --arch": ["compile", src, "--arch", "sm_xx"],
        "compile --arch of the other backend": ["compile", src, "--arch", "gfx90a"],
        "compile bad -D": ["compile", src, "--arch", "sm_90", "-D", "1bad"],
        "compile bad --max-registers": ["compile", src, "--arch", "sm_90", "--max-registers", "0"],
        "compile --max-registers not a number": ["compile", src, "--max-registers", "abc"],
        "compile unknown option": ["compile", src, "--bogus"],
        "compile missing argument": ["compile"],
        "compile empty --name-expression": ["compile", src, "--arch", "sm_90", "--name-expression", " "],
        "build bad --arch": ["build", src, "--arch", "sm_xx"],
        "build bad --ptx": ["build", src, "--arch", "sm_90", "--ptx", "sm_nope"],
        "build bad -D": ["build", src, "--arch", "sm_90", "-D", "a b"],
        "link bad --arch": ["link", cubin, "--arch", "zz"],
        "link bad -X": ["link", cubin, "--arch", "sm_90", "-X", "no-dash"],
        "link unknown option": ["link", cubin, "--bogus"],
        "inspect missing argument": ["inspect"],
        "info unknown option": ["info", "--bogus"],
        "cache unknown command": ["cache", "nope"],
        "cache ls bad --limit": ["cache", "ls", "--limit", "-1"],
        "cache prune nothing": ["cache", "prune"],
        "cache prune bad size": ["cache", "prune", "--max-size", "abc"],
        "cache prune bad age": ["cache", "prune", "--older-than", "1y"],
        "cache show missing argument": ["cache", "show"],
    }


def test_every_usage_error_exits_2_with_one_usage_error_object(tmp_path, src):
    for what, args in _usage_errors(tmp_path, src).items():
        res = invoke(*args, "--json")
        assert res.exit_code == 2, (what, res.output)
        err = json.loads(res.stdout)["error"]   # the whole of stdout: one object
        assert err["type"] == "UsageError" and err["exit_code"] == 2 and err["message"], what
        text = invoke(*args)
        assert text.exit_code == 2 and text.stdout == "" and "Traceback" not in text.output, what


def test_usage_errors_in_a_real_process(tmp_path, src):
    """The installed entry point, click's own errors included, not only CliRunner."""
    for args in (["compile", src, "--arch", "sm_xx"], ["compile", src, "-D", "1bad", "--arch", "sm_90"],
                 ["compile", src, "--nope"], ["cache", "prune", "--max-size", "lots"]):
        res = run_cli(*args, "--json", env={"KJIT_CACHE_DIR": str(tmp_path / "c")})
        assert res.returncode == 2, (args, res.stdout, res.stderr)
        assert json.loads(res.stdout)["error"]["type"] == "UsageError"
        assert "Traceback" not in res.stderr


def test_a_source_kjit_cannot_read_stays_exit_1(tmp_path):
    """Bad input is not bad usage: a file that is not text fails the command (exit 1)."""
    bad = tmp_path / "bin.cu"
    bad.write_bytes(b"\xff\xfe\0\0")
    assert invoke("compile", bad, "--arch", "sm_90", "--json").exit_code == 1


def test_a_bad_setting_is_a_usage_error_on_a_hit_and_on_a_miss(tmp_path, src):
    env = {"KJIT_CACHE_DIR": str(tmp_path / "c")}
    assert run_cli("compile", src, "--arch", "sm_90", "-o", tmp_path / "a.cubin", env=env).returncode == 0
    for extra in ([], ["-D", "MISS=1"]):     # the first is a cache hit, the second a miss
        res = run_cli("compile", src, "--arch", "sm_90", "-o", tmp_path / "b.cubin", "--json", *extra,
                      env=dict(env, KJIT_CACHE_SIZE="abc"))
        assert res.returncode == 2, (extra, res.stdout, res.stderr)
        err = json.loads(res.stdout)["error"]
        assert err["type"] == "UsageError" and "KJIT_CACHE_SIZE='abc'" in err["message"]
        assert "512M" in err["message"] and "Traceback" not in res.stderr


def test_interrupt_exits_130_with_one_object_and_no_aborted(monkeypatch, src):
    from kjit.compiler import cached

    def interrupted(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(cached, "compile", interrupted)
    res = invoke("compile", src, "--arch", "sm_90", "--json")
    assert res.exit_code == 130
    assert json.loads(res.stdout)["error"] == {"type": "Interrupted", "message": "interrupted",
                                               "exit_code": 130}
    res = invoke("compile", src, "--arch", "sm_90")
    assert res.exit_code == 130 and "Aborted!" not in res.output and "Traceback" not in res.output
    assert "interrupted" in res.stderr


@pytest.mark.parametrize("as_json", [False, True])
def test_sigint_during_a_command_exits_130(tmp_path, src, as_json):
    """Ctrl-C (SIGINT) while the command waits: here on an output FIFO no one reads (an
    input FIFO is refused before it is opened)."""
    import signal
    import subprocess
    import sys
    import time
    fifo = tmp_path / "slow.cubin"
    os.mkfifo(fifo)
    cmd = [sys.executable, "-m", "kjit.cli.main", "compile", str(src), "--arch", "sm_90",
           "-o", str(fifo)] + (["--json"] if as_json else [])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])), KJIT_CACHE_DIR=str(tmp_path / "c"))
    # SIGINT as a terminal delivers it, even where this test runs with it ignored (a background job)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 60   # until it blocks opening the FIFO
        while time.monotonic() < deadline and not _waiting_on(proc.pid, fifo):
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, (out, err)
    assert "Aborted!" not in err and "Traceback" not in err
    if as_json:
        assert json.loads(out)["error"]["type"] == "Interrupted"
    else:
        assert out == "" and "interrupted" in err


def _waiting_on(pid: int, path: Path) -> bool:
    """Whether the process has `path` open or is blocked in open() on it (Linux /proc)."""
    try:
        wchan = Path(f"/proc/{pid}/wchan").read_text()
        return "fifo" in wchan or "wait_for_partner" in wchan or any(
            os.readlink(f"/proc/{pid}/fd/{fd}") == str(path) for fd in os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return False


def test_warnings_read_as_messages_and_join_the_json_object(tmp_path, src):
    not_a_dir = tmp_path / "afile"
    not_a_dir.write_text("")
    env = {"KJIT_CACHE_DIR": str(not_a_dir)}
    res = run_cli("compile", src, "--arch", "sm_90", "-o", tmp_path / "a.cubin", env=env)
    assert res.returncode == 0, res.stderr
    assert res.stderr.startswith(f"warning: kjit cache directory {not_a_dir} cannot be used")
    assert "is not a directory" in res.stderr
    assert "CacheWarning" not in res.stderr and ".py:" not in res.stderr
    res = run_cli("compile", src, "--arch", "sm_90", "-o", tmp_path / "a.cubin", "--json", env=env)
    out = json.loads(res.stdout)
    assert len(out["warnings"]) == 1 and "is not a directory" in out["warnings"][0]


def test_the_cli_leaves_pythons_warnings_alone_for_library_users(tmp_path, src, monkeypatch):
    import warnings
    before = warnings.showwarning
    monkeypatch.setenv("KJIT_CACHE_DIR", str(tmp_path / "c"))
    assert invoke("compile", src, "--arch", "sm_90", "-o", tmp_path / "a.cubin").exit_code == 0
    assert warnings.showwarning is before


def test_bad_settings_on_the_command_line(tmp_path, src, monkeypatch):
    """KJIT_ARCH (read when no --arch is given and no GPU is visible) and the cache's
    settings: exit 2, the variable named, for compile and for the cache commands."""
    import kjit.arch as arch_mod
    monkeypatch.setattr(arch_mod, "device_arch", lambda ordinal=None: None)
    monkeypatch.setenv("KJIT_ARCH", "sm_xx")
    err = json.loads(invoke("compile", src, "--json").stdout)["error"]
    assert err["type"] == "UsageError" and "$KJIT_ARCH='sm_xx'" in err["message"]
    monkeypatch.delenv("KJIT_ARCH")
    monkeypatch.setenv("KJIT_CACHE_MEMORY_SIZE", "12 parsecs")
    for args in (["cache", "stats"], ["cache", "path"], ["cache", "prune", "--max-size", "1G"]):
        res = invoke(*args, "--json")
        assert res.exit_code == 2, (args, res.output)
        assert "KJIT_CACHE_MEMORY_SIZE='12 parsecs'" in json.loads(res.stdout)["error"]["message"]
