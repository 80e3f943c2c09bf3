"""The one-call tensor reader kjit builds against the installed PyTorch
(kjit/runtime/torch_facts.py) is native code kept in the cache directory: it is loaded only
where kjit's cache rules trust the file, never through a link, and never from a file anyone
else could have replaced. Its answers are tested on the GPU machine
(tests/test_foreign_arrays_gpu.py)."""
import os

import pytest

from kjit.cache import Untrusted
from kjit.runtime import torch_facts

pytestmark = pytest.mark.skipif(not hasattr(os, "geteuid"), reason="POSIX file ownership")


def _kept(tmp_path, mode=0o600, dir_mode=0o700):
    d = tmp_path / "native"
    d.mkdir()
    f = d / "torch-facts-0123.so"
    f.write_bytes(b"\x7fELF\x02\x01\x01" + b"\0" * 57)   # not a loadable library
    os.chmod(f, mode)
    os.chmod(d, dir_mode)
    return f


@pytest.mark.parametrize("mode, dir_mode", [(0o666, 0o700), (0o646, 0o700), (0o600, 0o777)])
def test_a_reader_file_or_folder_others_can_write_is_never_loaded(tmp_path, mode, dir_mode):
    f = _kept(tmp_path, mode, dir_mode)
    with pytest.raises(Untrusted, match="writable by every user"):
        torch_facts._load(f)


def test_a_link_planted_where_the_reader_is_kept_is_not_followed(tmp_path):
    f = _kept(tmp_path)
    os.unlink(f)
    planted = tmp_path / "elsewhere.so"
    planted.write_bytes(b"\x7fELF")
    f.symlink_to(planted)
    with pytest.raises(OSError):
        torch_facts._load(f)


def test_a_trusted_file_that_is_no_library_is_refused(tmp_path):
    f = _kept(tmp_path)
    with pytest.raises(OSError):
        torch_facts._load(f)
