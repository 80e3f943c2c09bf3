"""The kernel signatures and plain struct definitions of a source, kept with its ObjectCode.

At load time kjit needs each parameter's C type to convert arguments exactly; the compiled
binary does not record it. compile() keeps this small digest of the source (not the source
itself) in the object's metadata, so a cached or saved object still knows its signatures.
"""
from __future__ import annotations

import re

COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
KERNEL = re.compile(
    r"__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?"
    r"([A-Za-z_]\w*)\s*\(([^)]*)\)", re.S)
STRUCT = re.compile(
    r"(?:typedef\s+)?struct\s*(?:__align__\s*\(\s*(\d+)\s*\)\s*)?([A-Za-z_]\w*)?\s*"
    r"(?:__align__\s*\(\s*(\d+)\s*\)\s*)?\{([^{}]*)\}\s*([A-Za-z_]\w*)?\s*;", re.S)


# `typedef T name;` and `using name = T;` for T a plain type name (no pointer, array, template):
# llm.c's `typedef __nv_bfloat16 floatX;` and kernels taking floatX*
ALIAS = re.compile(r"\btypedef\s+([A-Za-z_][\w:\s]*?)\s+([A-Za-z_]\w*)\s*;|"
                   r"\busing\s+([A-Za-z_]\w*)\s*=\s*([A-Za-z_][\w:\s]*?)\s*;")


def aliases(text: str) -> dict[str, str]:
    """The plain type aliases of a comment-free source: name -> the type it stands for."""
    out: dict[str, str] = {}
    for m in ALIAS.finditer(text):
        name, target = (m.group(2), m.group(1)) if m.group(2) else (m.group(3), m.group(4))
        out[name] = " ".join(target.split())
    return out


def strip_comments(source: str) -> str:
    return COMMENTS.sub(" ", source)


def is_template(text: str, start: int) -> bool:
    """Whether the __global__ at `start` belongs to a template declaration."""
    head = text[max(0, start - 300):start]
    return "template" in head.split(";")[-1].split("}")[-1]


def extract(source: str) -> str:
    """A minimal source holding the plain type aliases, struct definitions and non-template
    kernel signatures."""
    text = strip_comments(source)
    parts = [f"typedef {target} {name};" for name, target in aliases(text).items()]
    parts += [m.group(0) for m in STRUCT.finditer(text)]
    for m in KERNEL.finditer(text):
        if not is_template(text, m.start()):
            parts.append(f"__global__ void {m.group(1)}({' '.join(m.group(2).split())}) {{}}")
    return "\n".join(parts)
