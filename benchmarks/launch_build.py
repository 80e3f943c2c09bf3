"""kjit's launch extension built from a directory of its sources, for the benchmarks that
take the launcher apart (launch_marks.py, launch_pieces.py): compiled as `pip install` would,
with the running Python's flags and headers, and loaded as a module of its own."""
from __future__ import annotations

import ast
import importlib.util
import sysconfig
import subprocess
from pathlib import Path
from types import ModuleType

SETUP = Path(__file__).resolve().parent.parent / "setup.py"


def sources() -> list[str]:
    """The extension's C files, as setup.py lists them (file names in the runtime directory)."""
    for node in ast.walk(ast.parse(SETUP.read_text())):
        if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Extension"
                and ast.literal_eval(node.args[0]) == "kjit.runtime._launch"):
            return [Path(f).name for f in ast.literal_eval(node.args[1])]
    raise RuntimeError(f"{SETUP} names no kjit.runtime._launch extension")


def runtime_dir() -> Path:
    """The directory of the installed kjit's runtime sources."""
    return Path(importlib.util.find_spec("kjit").origin).parent / "runtime"


def build(src: Path, out_dir: Path, extra: tuple[str, ...] = ()) -> Path:
    """The extension built from `src` (a runtime directory) into `out_dir`: its path."""
    so = out_dir / ("_launch" + sysconfig.get_config_var("EXT_SUFFIX"))
    cc = (sysconfig.get_config_var("CC") or "cc").split()
    flags = (sysconfig.get_config_var("CFLAGS") or "").split() + (sysconfig.get_config_var("CCSHARED") or "").split()
    subprocess.run([*cc, *flags, "-shared", *extra, f"-I{src}", f"-I{sysconfig.get_paths()['include']}",
                    "-o", str(so), *(str(src / f) for f in sources()), "-ldl"], check=True, capture_output=True)
    return so


def load(so: Path) -> ModuleType:
    """The built extension as a module named as the shipped one, not registered in sys.modules:
    each copy keeps its own statics."""
    spec = importlib.util.spec_from_file_location("kjit.runtime._launch", so)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
