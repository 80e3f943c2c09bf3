"""The launcher's pieces (benchmarks/launch_pieces.py): every edit still applies exactly once to
kjit/runtime/_launch.c, so the benchmark takes out what it names, and each copy builds and
loads as an extension of its own."""
import shutil
import sysconfig

import pytest

from benchmarks import launch_pieces
from benchmarks.launch_build import load, runtime_dir


def test_each_edit_applies_once_to_the_launcher_source():
    source = (runtime_dir() / "_launch.c").read_text()
    for name, edits in launch_pieces.PIECES.items():
        out = launch_pieces.edited(source, edits)
        assert out != source, name
    with pytest.raises(ValueError, match="applies 0 times"):
        launch_pieces.edited(source, [("no such line", "")])


def test_each_copy_builds_and_loads_on_its_own(tmp_path):
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(cc) is None:
        pytest.skip(f"no C compiler ({cc}) to build the copies with")
    copies = launch_pieces.build_copies(tmp_path)
    assert set(copies) == {"kjit bound launcher", *launch_pieces.PIECES}
    modules = [load(so) for so in copies.values()]
    assert len({id(m) for m in modules}) == len(modules)
    assert all(callable(m.launcher) for m in modules)
