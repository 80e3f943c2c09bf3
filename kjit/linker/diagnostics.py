"""Reading linker logs: undefined symbols and the input that failed, for LinkError."""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Sequence

from ..errors import LinkError

if TYPE_CHECKING:
    from .inputs import LinkInput

# nvJitLink: "error   : Undefined reference to 'twice' in 'b.ptx'"; after LTO, ptxas:
# "ptxas fatal   : Unresolved extern function 'twice'"; the driver's linker logs the former.
_UNDEFINED_RE = re.compile(
    r"(?:[Uu]ndefined reference to|[Uu]nresolved extern (?:function|variable))\s+'([^']+)'"
    r"(?:\s+in\s+'([^']+)')?")
# "ERROR NVJITLINK_ERROR_PTX_COMPILE: JIT the PTX (kernel.ptx)"
_JIT_INPUT_RE = re.compile(r"JIT the PTX \(([^)]+)\)")
_BAD_INPUT_RE = re.compile(r"bad input:\s*(?:does not match type \w+)?\s*(\S.*)$", re.M)


def undefined_symbols(log: str) -> list[tuple[str, str | None]]:
    """(symbol, input that references it or None), in log order, without repeats."""
    out: list[tuple[str, str | None]] = []
    for m in _UNDEFINED_RE.finditer(log):
        item = (m.group(1), m.group(2))
        if item not in out:
            out.append(item)
    return out


def failing_input(log: str, names: Sequence[str]) -> str | None:
    """The input a log blames, if it names one of ours."""
    for rx in (_JIT_INPUT_RE, _BAD_INPUT_RE):
        for m in rx.finditer(log):
            text = m.group(1).strip()
            for name in sorted(names, key=len, reverse=True):
                if text == name or text.endswith(name):
                    return name
    for sym, where in undefined_symbols(log):
        if where in names:
            return where
    return None


def demangle_hint(symbol: str) -> str:
    if symbol.startswith("_Z"):
        return (f" ({symbol} is a C++ mangled name: declare the function extern \"C\" on both "
                "sides, or make the declarations match exactly)")
    return ""


def referencing_inputs(symbol: str, inputs: Sequence["LinkInput"]) -> list[str]:
    """The inputs whose bytes show they use `symbol` without defining it."""
    out = []
    for item in inputs:
        refs = item.external_references()
        if refs is not None and symbol in refs:
            out.append(item.name)
    return out


def link_error(message: str, *, error_log: str, info_log: str, backend: str,
               inputs: Sequence["LinkInput"], libraries: Sequence[str] = (),
               input_name: str | None = None, arch: str | None = None) -> LinkError:
    """A LinkError with the undefined symbol, the failing input and both logs filled in."""
    names = [i.name for i in inputs] + list(libraries)
    undefined = undefined_symbols(error_log) or undefined_symbols(info_log)
    symbol = None
    if undefined:
        symbol = undefined[0][0]
        syms = [s for s, _ in undefined]
        # Our own reading of the inputs first: nvJitLink names the last input added, which
        # is not always the one that holds the reference.
        where: list[str] = []
        for sym, logged in undefined:
            found = referencing_inputs(sym, inputs) or ([logged] if logged in names else [])
            where += [w for w in found if w not in where]
        message = (f"undefined symbol{'s' if len(syms) > 1 else ''} {', '.join(syms)}"
                   + (f" referenced from {', '.join(where)}" if where else "")
                   + f": no input defines {'it' if len(syms) == 1 else 'them'}; add the input "
                     "that does, and compile every input with relocatable=True"
                   + demangle_hint(symbol))
        if any(i.kind == "library" for i in inputs):
            message += (" (an archive is searched for host objects with embedded device code, "
                        "as nvcc -rdc=true -lib makes them)")
        input_name = input_name or (where[0] if where else None)
    else:
        input_name = input_name or failing_input(error_log, names)
        have = next((i.arch for i in inputs if i.name == input_name), None)
        if have and arch and have.startswith("sm_") and have.split("_")[1] != arch.split("_")[1]:
            message += f" ({input_name} is code for {have}, the link targets {arch})"
    return LinkError(message, error_log=error_log, info_log=info_log, input_name=input_name,
                     backend=backend, symbol=symbol, inputs=names)
