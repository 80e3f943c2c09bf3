"""Where a process's precompiled headers live, on disk: its private directory, the sweep of
those that killed processes left, the room NVRTC needs for a PCH compile, and a PCH file's
identity.

NVRTC backs a PCH compile's heap with a sparse file in its temporary directory and maps the
PCH file itself, checking neither: a write that fails (a full disk) or a file cut short
ends the process with SIGBUS. So a PCH compile runs only where there is room, and a PCH file
is used only while it is the file NVRTC wrote.
"""
from __future__ import annotations

import os

SPACE_MARGIN = 64 << 20   # free space kept beyond what NVRTC's PCH heap and file can take
_PID_LIMIT = 1 << 22      # Linux's largest pid (PID_MAX_LIMIT): a name above it has no process


def ident(path: str) -> tuple | None:
    """What changes when a file is cut short, written or replaced: device, inode, size,
    times; None where it is gone."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def nvrtc_temp_dir() -> str:
    """Where NVRTC puts the file behind a PCH compile's heap: $TMPDIR, else /tmp (not
    Python's choice, which also reads TMP and TEMP)."""
    return os.environ.get("TMPDIR") or "/tmp"


def free_bytes(path: str) -> int:
    """Bytes this user may still write on `path`'s file system."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def room(heap: int, pch_dir: str | None, building: bool) -> bool:
    """Whether NVRTC has room for a PCH compile with a heap of `heap` bytes: the heap's file
    (sparse, at most the heap's size) in its temporary directory and, when building, the
    PCH (at most the heap's size) in `pch_dir` (Python's temporary directory where None);
    both with SPACE_MARGIN to spare, added up where they share a file system."""
    places = [(nvrtc_temp_dir(), heap + SPACE_MARGIN)]
    if building:
        import tempfile
        places.append((pch_dir or tempfile.gettempdir(), heap))
    need: dict[int, list] = {}   # file system -> [bytes needed, a directory on it]
    for path, n in places:
        try:
            dev = os.stat(path).st_dev
        except OSError:
            continue   # NVRTC cannot make its file there: the compile says so, no SIGBUS
        need.setdefault(dev, [0, path])[0] += n
    try:
        return all(free_bytes(path) >= n for n, path in need.values())
    except OSError:
        return False


def make_dir(prefix: str) -> str:
    """A new private directory (mode 700) `prefix`<pid>-... in Python's temporary directory,
    after sweeping the ones killed processes left there; OSError where it cannot be made."""
    import tempfile
    base = tempfile.gettempdir()
    try:
        sweep(base, prefix)
    except Exception:  # others' leftovers: never a reason to go without PCHs
        pass
    return tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=base)


def sweep(base: str, prefix: str) -> None:
    """Remove the `prefix`<pid>-... directories in `base` of this user's processes that are
    gone (killed before their exit removed them), or whose name holds no possible pid."""
    import shutil
    uid = os.getuid()
    try:
        names = [n for n in os.listdir(base) if n.startswith(prefix)]
    except OSError:
        return
    for n in names:
        pid = n[len(prefix):].split("-", 1)[0]
        path = os.path.join(base, n)
        try:
            if not pid.isascii() or not pid.isdigit() or os.lstat(path).st_uid != uid:
                continue
            if 0 < int(pid) < _PID_LIMIT:
                os.kill(int(pid), 0)
                continue   # its process lives
        except ProcessLookupError:
            pass
        except OSError:
            continue
        shutil.rmtree(path, ignore_errors=True)   # its process is gone, or never was one
