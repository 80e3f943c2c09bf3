"""Every input kjit reads whole is bounded, and only a regular file is read (issue 40).

`kjit compile /dev/zero` grew to 23 GB, `/dev/urandom` and a FIFO with no writer hung, and
a 2 GiB sparse file took 4 GB: each command that reads a file is run here in a real process
under a time limit and an address-space limit, so the old behaviour fails the test (a
timeout, or MemoryError's exit 70) instead of taking the machine down. Devices are only
ever inputs here.
"""
from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from kjit.errors import InvalidOptionError

ROOT = Path(__file__).resolve().parents[1]
LIMIT_S = 60
ADDRESS_SPACE = 3 << 30   # far below what reading /dev/zero or a 2 GiB file whole takes

# command line for each command reading FILE (a source, a binary or an export)
COMMANDS = {
    "compile": lambda f, out: ["compile", f, "--arch", "sm_90", "-o", out / "o.cubin"],
    "build": lambda f, out: ["build", f, "--arch", "sm_90", "-o", out / "o.fatbin"],
    "build --link": lambda f, out: ["build", out / "k.cu", "--arch", "sm_90", "--link", f,
                                    "-o", out / "o.fatbin"],
    "link": lambda f, out: ["link", f, "--arch", "sm_90", "-o", out / "o.cubin"],
    "inspect": lambda f, out: ["inspect", f],
    "cache import": lambda f, out: ["cache", "import", f],
}


def _limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def run_cli(args, tmp_path: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, KJIT_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    try:
        return subprocess.run([sys.executable, "-m", "kjit.cli.main", *map(str, args)], env=env,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=LIMIT_S, preexec_fn=_limit_memory)
    except subprocess.TimeoutExpired:
        pytest.fail(f"kjit {' '.join(map(str, args))} still ran after {LIMIT_S} s (it hangs)")


@pytest.fixture
def work(tmp_path):
    (tmp_path / "k.cu").write_text('extern "C" __global__ void k(float *x) { x[0] = 1; }\n')
    return tmp_path


def _special(kind: str, work: Path):
    """The path of a special file of this kind, and what kjit's message calls it."""
    if kind == "fifo":
        os.mkfifo(work / "in.fifo")   # no writer, ever: open() for reading would block
        return work / "in.fifo", "FIFO"
    if kind == "socket":
        d = Path(tempfile.mkdtemp(prefix="kjit-sock"))   # a short path: sun_path has 108 bytes
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(str(d / "s"))
        work.joinpath("sock").write_text(str(d / "s"))
        return d / "s", "socket"
    return Path(kind), "character device"


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("kind", ["/dev/zero", "fifo"])
def test_a_device_or_fifo_is_refused_by_name(work, command, kind):
    path, called = _special(kind, work)
    res = run_cli(COMMANDS[command](path, work), work)
    assert res.returncode == 1, res.stderr[-2000:]
    assert str(path) in res.stderr and called in res.stderr and "not a regular file" in res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize("kind", ["/dev/urandom", "socket"])
def test_endless_and_unreadable_sources_are_refused(work, kind):
    path, called = _special(kind, work)
    res = run_cli(["compile", path, "--arch", "sm_90", "-o", work / "o.cubin", "--json"], work)
    assert res.returncode == 1, res.stderr[-2000:]
    error = json.loads(res.stdout)["error"]
    assert error["exit_code"] == 1 and called in error["message"] and str(path) in error["message"]


@pytest.mark.parametrize("command,limit", [("compile", "64.0 MiB"), ("build", "64.0 MiB"),
                                           ("inspect", "1.0 GiB"), ("link", "1.0 GiB")])
def test_a_huge_sparse_file_is_refused_by_its_size(work, command, limit):
    big = work / "big.bin"
    with open(big, "wb") as f:
        f.truncate(2 << 30)   # 2 GiB that take no disk
    res = run_cli(COMMANDS[command](big, work), work)
    assert res.returncode == 1, res.stderr[-2000:]
    assert str(big) in res.stderr and "2147483648 bytes" in res.stderr and limit in res.stderr


def test_a_source_within_the_limit_still_compiles(work):
    res = run_cli(["compile", work / "k.cu", "--arch", "sm_90", "-o", work / "o.cubin"], work)
    assert res.returncode == 0, res.stderr[-2000:]
    assert (work / "o.cubin").read_bytes()[:4] == b"\x7fELF"


# --- the library: the same reader ------------------------------------------------------------

def test_from_file_refuses_a_device_and_ignores_a_fifo_sidecar(work):
    from kjit import ObjectCode
    with pytest.raises(InvalidOptionError, match="character device"):
        ObjectCode.from_file("/dev/zero")
    ptx = work / "k.ptx"
    ptx.write_text(".version 8.0\n.target sm_90\n.address_size 64\n")
    os.mkfifo(work / "k.ptx.kjit.json")   # a sidecar no one writes: ignored, not waited for
    assert ObjectCode.from_file(ptx).kind == "ptx"


def test_read_input_stops_at_its_limit(work):
    from kjit.fileio import read_input
    (work / "five").write_bytes(b"12345")
    assert read_input(work / "five", 5, "source") == b"12345"
    with pytest.raises(InvalidOptionError, match=r"five: it is 5 bytes .* more than kjit reads for a source"):
        read_input(work / "five", 4, "source")


def test_cache_import_of_a_fifo_raises_from_the_api(work, monkeypatch):
    import kjit
    monkeypatch.setenv("KJIT_CACHE_DIR", str(work / "cache"))
    os.mkfifo(work / "export.zip")
    with pytest.raises(InvalidOptionError, match="FIFO"):
        kjit.cache.import_(work / "export.zip")
