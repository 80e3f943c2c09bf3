"""The one-call tensor reader kjit builds against the installed PyTorch
(kjit/runtime/torch_facts.py) is native code kept in the cache directory: it is loaded only
where kjit's cache rules trust the file, never through a link, and never from a file anyone
else could have replaced. Its answers are tested on the GPU machine
(tests/test_foreign_arrays_gpu.py)."""
import ctypes
import errno
import os
import shutil
import subprocess

import pytest

from kjit.cache import Untrusted
from kjit.runtime import torch_facts

pytestmark = pytest.mark.skipif(not hasattr(os, "geteuid"), reason="POSIX file ownership")

# a stand-in with the reader's name and signature, so that what refuses a file is the rule
# under test and not the file's content
STAND_IN = r'''
struct Facts { int device_type; };
int kjit_torch_facts(const void* tensor, struct Facts* out) { out->device_type = 42; return 7; }
'''


def _kept(tmp_path, mode=0o600, dir_mode=0o700):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build a stand-in library")
    d = tmp_path / "native"
    d.mkdir()
    src = tmp_path / "stand_in.c"
    src.write_text(STAND_IN)
    f = d / "torch-facts-0123.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(f), str(src)], check=True)
    os.chmod(f, mode)
    os.chmod(d, dir_mode)
    return f


def test_a_kept_reader_this_user_wrote_privately_is_loaded(tmp_path):
    fn = torch_facts._load(_kept(tmp_path))
    out = torch_facts.Facts()
    assert fn(None, ctypes.byref(out)) == 7 and out.device_type == 42
    assert [p.name for p in (tmp_path / "native").iterdir()] == ["torch-facts-0123.so"]   # its copy is gone


@pytest.mark.parametrize("mode, dir_mode", [(0o666, 0o700), (0o646, 0o700), (0o600, 0o777)])
def test_a_reader_file_or_folder_others_can_write_is_never_loaded(tmp_path, mode, dir_mode):
    f = _kept(tmp_path, mode, dir_mode)
    with pytest.raises(Untrusted, match="writable by every user"):
        torch_facts._load(f)


def test_a_link_planted_where_the_reader_is_kept_is_not_followed(tmp_path):
    f = _kept(tmp_path)
    planted = tmp_path / "elsewhere.so"
    os.rename(f, planted)   # a loadable library: only the link stops it
    f.symlink_to(planted)
    with pytest.raises(OSError) as exc:
        torch_facts._load(f)
    assert exc.value.errno == errno.ELOOP


def test_a_trusted_file_that_is_no_library_is_refused(tmp_path):
    f = _kept(tmp_path)
    f.write_bytes(b"\x7fELF\x02\x01\x01" + b"\0" * 57)
    with pytest.raises(OSError):
        torch_facts._load(f)
