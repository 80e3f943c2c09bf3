"""The documentation covers the product: every public name in the API reference, every
KJIT_* variable the code reads on the environment page, and a site that builds without
warnings (where Sphinx is installed: pip install '.[docs]', as CI does)."""
from __future__ import annotations

import importlib
import io
import re
import subprocess
import sys
import tokenize
import zlib
from pathlib import Path

import pytest

import kjit

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_ROOT = Path(kjit.__file__).resolve().parent.parent   # kjit/ as tested: checkout or wheel
DOCS = ROOT / "docs"
API = DOCS / "api.rst"
ENVIRONMENT = DOCS / "environment.md"
_DIRECTIVE = re.compile(r"^\s*\.\. (?:py:)?(?:auto)?(?:function|class|exception|data|module|"
                        r"decorator|method|attribute|property)::\s+(kjit[\w.]*)", re.M)
_KJIT_VAR = re.compile(r"\bKJIT_[A-Z0-9_]*[A-Z0-9]")


def public_names() -> set[str]:
    """Every name a user imports from kjit: kjit's exports, the cache's and autotune's."""
    names = {f"kjit.{n}" for n in kjit.__all__}
    names |= {f"kjit.cache.{n}" for n in kjit.cache.__all__}
    names |= {f"kjit.autotune.{n}" for n in vars(kjit.autotune) if not n.startswith("_")}
    return names


def test_api_reference_names_every_public_name():
    documented = set(_DIRECTIVE.findall(API.read_text()))
    missing = sorted(public_names() - documented)
    assert not missing, (f"docs/api.rst documents no {', '.join(missing)}: add an autodoc "
                         "directive (.. autofunction:: / .. autoclass:: ...) for each")


def test_api_reference_names_only_what_exists():
    """A directive naming something kjit no longer has would fail the Sphinx build in CI;
    say so here too, where Sphinx may not be installed."""
    for name in set(_DIRECTIVE.findall(API.read_text())):
        try:
            _resolve(name)
        except (ImportError, AttributeError):
            pytest.fail(f"docs/api.rst documents {name}, which kjit does not have")


GUIDES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
_PATH = re.compile(r"(?<![\w/.-])(?:kjit|tests|benchmarks|scripts|examples|docs|\.ci)/[\w./*-]*[\w/*]")
_DOTTED = re.compile(r"(?<![\w.])kjit(?:\.[A-Za-z_]\w*)+")
# Dotted names that are not modules: the entry-point group kjit reads remote backends from
# (a guide naming another group would still fail)
_NOT_MODULES = {importlib.import_module("kjit.cache.registry").GROUP}


def test_guides_name_only_files_and_modules_that_exist():
    """A guide naming a file (kjit/compiler/keys/observe.py) or a module or object
    (kjit.formats.bundle.write_bundle) that has moved sends readers nowhere."""
    stale = []
    for page in GUIDES:
        text = page.read_text()
        stale += [f"{page.name}: {p}" for p in set(_PATH.findall(text))
                  if not _exists(PACKAGE_ROOT if p.startswith("kjit/") else ROOT, p)]
        for name in set(_DOTTED.findall(text)) - _NOT_MODULES:
            try:
                _resolve(name)
            except (ImportError, AttributeError):
                stale.append(f"{page.name}: {name}")
    assert not stale, "the docs name what does not exist: " + "; ".join(sorted(stale))


def _exists(root: Path, p: str) -> bool:
    return bool(list(root.glob(p))) if "*" in p else (root / p).exists()


def _read_variables() -> dict[str, set[str]]:
    """KJIT_* names in kjit's Python string literals (docstrings and messages included) and
    keyword names (dict(os.environ, KJIT_X=...)), and in its C string literals (not macros
    such as include guards) -> the files naming them."""
    found: dict[str, set[str]] = {}
    for path in sorted((PACKAGE_ROOT / "kjit").rglob("*.py")):
        for tok in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
            if tok.type == tokenize.STRING or tok.type == getattr(tokenize, "FSTRING_MIDDLE", -1) \
                    or (tok.type == tokenize.NAME and tok.string.startswith("KJIT_")):
                for name in _KJIT_VAR.findall(tok.string):
                    found.setdefault(name, set()).add(str(path.relative_to(PACKAGE_ROOT)))
    for pattern in ("*.c", "*.h"):
        for path in sorted((PACKAGE_ROOT / "kjit").rglob(pattern)):
            for literal in re.findall(r'"(?:[^"\\\n]|\\.)*"', path.read_text()):
                for name in _KJIT_VAR.findall(literal):
                    found.setdefault(name, set()).add(str(path.relative_to(PACKAGE_ROOT)))
    return found


def _listed_variables() -> set[str]:
    """The variables docs/environment.md describes: one heading each."""
    return {m for line in ENVIRONMENT.read_text().splitlines() if line.startswith("#")
            for m in _KJIT_VAR.findall(line)}


def test_the_scan_finds_the_variables_kjit_reads():
    """The scan itself sees literals, keyword names and C strings, not C macros."""
    found = _read_variables()
    assert {"KJIT_CACHE_DIR", "KJIT_ARCH", "KJIT_REMOTE_CACHE_KEY_FILE",
            "KJIT_COMPILE_POOL_IDLE"} <= set(found)
    assert not any(name.endswith("_H") for name in found), "an include guard is not a variable"


def test_environment_page_lists_every_variable_kjit_reads():
    missing = {name: files for name, files in _read_variables().items()
               if name not in _listed_variables()}
    assert not missing, "docs/environment.md does not describe: " + "; ".join(
        f"{name} (read in {', '.join(sorted(files))})" for name, files in sorted(missing.items()))


def _inventory(path: Path) -> dict[str, str]:
    """The Python objects a Sphinx objects.inv (version 2) lists -> their role (py:class...)."""
    body = zlib.decompress(path.read_bytes().split(b"\n", 4)[4]).decode()
    rows = (line.split(" ", 2) for line in body.splitlines())
    return {row[0]: row[1] for row in rows if len(row) > 1 and row[1].startswith("py:")}


def _resolve(name: str) -> object:
    """The object a dotted name documents, as autodoc finds it: the longest importable module
    prefix, then attributes."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for part in parts[i:]:
            obj = getattr(obj, part)
        return obj
    raise ImportError(name)


def _public_members(cls: type) -> set[str]:
    """The class's own public attributes, and those of the private kjit bases it gets them
    from: what a user calls on it."""
    names: set[str] = set()
    for base in cls.__mro__:
        if base is cls or (base.__module__.startswith("kjit") and base.__name__.startswith("_")):
            names |= {n for n in vars(base) if not n.startswith("_")}
    return names


@pytest.fixture(scope="module")
def built_site(tmp_path_factory):
    pytest.importorskip("sphinx", reason="Sphinx is not installed: pip install '.[docs]'")
    pytest.importorskip("myst_parser", reason="myst-parser is not installed: pip install '.[docs]'")
    out = tmp_path_factory.mktemp("site")
    run = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
                          str(DOCS), str(out)], capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0, f"the docs do not build without warnings:\n{run.stderr[-6000:]}"
    return out


def test_built_reference_documents_every_public_name_and_method(built_site):
    inventory = _inventory(built_site / "objects.inv")
    missing = sorted(public_names() - set(inventory))
    # the classes as the reference names them (Sphinx also lists each under its defining
    # module, with no members there)
    classes = {name for name in set(_DIRECTIVE.findall(API.read_text())) | public_names()
               if inventory.get(name) == "py:class"}
    for name in classes:
        missing += [f"{name}.{m}" for m in sorted(_public_members(_resolve(name)))
                    if f"{name}.{m}" not in inventory]
    assert not missing, f"the built API reference lacks: {', '.join(missing)}"
    # the methods people asked for by name, so that none of them can drop out unnoticed
    for name in ("kjit.Kernel.launch", "kjit.Kernel.set_max_dynamic_shared",
                 "kjit.Kernel.suggested_block_size", "kjit.Event.elapsed_time",
                 "kjit.decorator.KernelFunction.specialize", "kjit.LinkOptions",
                 "kjit.CompileOptions", "kjit.compile_many", "kjit.autotune"):
        assert name in inventory, name


def test_built_site_holds_every_guide(built_site):
    for page in DOCS.glob("*.md"):
        assert (built_site / page.with_suffix(".html").name).is_file(), page.name


def test_figures_the_code_defines_are_the_docs_figures():
    """Where a page states a constant of the code (how much a process hashes without
    OpenSSL, how often hit counts reach the disk, how much a listing reads of each value of
    the shared tier), it states the code's value."""
    from kjit import hashing
    from kjit.cache import admin, lookup, redis_backend
    flat = {name: " ".join((DOCS / name).read_text().split())
            for name in ("performance.md", "cluster.md", "architecture.md")}
    assert f"for a process's first {hashing.BUILTIN_BUDGET >> 10} KiB" in flat["performance.md"]
    for page in ("performance.md", "architecture.md"):
        assert f"at most every {lookup.FLUSH_INTERVAL_S:g} s" in flat[page], page
    assert (f"a listing reads at most {admin._HEAD >> 10} KiB of each value" in flat["cluster.md"]
            and f"in requests of at most {redis_backend._BATCH} values" in flat["cluster.md"])
