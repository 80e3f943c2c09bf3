"""Sphinx configuration: the Markdown guides (MyST) and the API reference (autodoc) as one site.

Build: ``sphinx-build -W --keep-going -b html docs build/docs`` (pip install '.[docs]').
"""
from __future__ import annotations

import os
import sys

# Build from this checkout, not an installed kjit, so the reference matches the source.
sys.path.insert(0, os.path.abspath(".."))

import kjit  # noqa: E402

project = "kjit"
author = "the kjit authors"
release = kjit.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]

# MyST: `#`-anchors in links between the guides resolve to their headings.
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence", "deflist"]

# autodoc: the reference documents the names users import from kjit (kjit/__init__.py's lazy
# names), in source order, with their signatures' annotations shown as written.
autodoc_default_options = {
    "members": True,
    "undoc-members": True,
    "member-order": "bysource",
}
autodoc_typehints = "signature"
autodoc_typehints_format = "short"
autodoc_preserve_defaults = True
autodoc_class_signature = "mixed"
# kjit's docstrings are plain prose with `code` in single backquotes: read that as literal
# code, as the Markdown guides do, instead of as an RST cross-reference role.
default_role = "code"
napoleon_google_docstring = True
napoleon_numpy_docstring = False

html_theme = "alabaster"
html_title = f"kjit {release}"
html_static_path: list[str] = []


def _drop_namedtuple_aliases(app, what, name, obj, options, lines):
    """A NamedTuple field's generated docstring ("Alias for field number 0") says nothing a
    reader needs: the field's name and type say it."""
    if len(lines) == 1 and lines[0].startswith("Alias for field number"):
        lines.clear()


def _drop_builtin_docstrings(app, what, name, obj, options, lines):
    """A module constant (a str, int or dict) has no docstring of its own: autodoc would show
    its type's ("str(object='') -> str..."). The reference says what it is instead."""
    if what in ("data", "attribute") and type(obj).__module__ == "builtins" \
            and "\n".join(lines).strip() == (type(obj).__doc__ or "").strip():
        lines.clear()


# Classes kjit hands out but users do not construct: their constructors' parameters are
# kjit's internals, so the reference shows them without a signature.
_HANDED_OUT = {"kjit.Kernel", "kjit.decorator.KernelFunction", "kjit.runtime.module.Global",
               "kjit.LinkResult", "kjit.autotune.Result", "kjit.autotune.Autotuned"}


def _hide_internal_constructors(app, what, name, obj, options, signature, return_annotation):
    if what == "class" and name in _HANDED_OUT:
        return "", None
    return None


def setup(app):
    app.connect("autodoc-process-signature", _hide_internal_constructors)
    app.connect("autodoc-process-docstring", _drop_namedtuple_aliases)
    app.connect("autodoc-process-docstring", _drop_builtin_docstrings)
