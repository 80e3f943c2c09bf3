"""Parameter types from an Itanium-mangled kernel name (`_Z4axpyIfEvT_PKS0_PS0_i`).

Template kernels and C++-linkage kernels have no `extern "C"` signature to parse, but their
mangled names spell out every parameter type. This decoder covers what kernel signatures
use: builtin types, pointers, references, cv-qualifiers, class names (float4, __half,
structs), namespaces, template arguments and parameters, and substitutions. Anything it
does not understand yields None and the driver's parameter sizes are used instead.

The same decoding finds the kernel a C++ name means (`find_kernel`): a kernel without
`extern "C"` asked for as `saxpy`, as PyCUDA's SourceModule lets one write it.
"""
from __future__ import annotations

from typing import Mapping, Sequence

from ..errors import KernelNotFoundError

_BUILTIN = {
    "v": "void", "b": "bool", "c": "char", "a": "signed char", "h": "unsigned char",
    "s": "short", "t": "unsigned short", "i": "int", "j": "unsigned int", "l": "long",
    "m": "unsigned long", "x": "long long", "y": "unsigned long long", "f": "float",
    "d": "double", "e": "long double", "w": "wchar_t", "n": "__int128", "o": "unsigned __int128",
}
_D_BUILTIN = {"Dh": "__half", "Dn": "decltype(nullptr)", "Di": "char32_t", "Ds": "char16_t",
              "DF16_": "__half"}


def _literal(body: str) -> str:
    """A non-type template argument as C++ spells it: `i4` is 4, `jn2`... `b1` is true."""
    code, value = body[:1], body[1:]
    if code == "b" and value in ("0", "1"):
        return "true" if value == "1" else "false"
    if code in _BUILTIN and code not in "fde" and value.lstrip("n").isdigit():
        number = ("-" if value.startswith("n") else "") + value.lstrip("n")
        return number + {"j": "u", "l": "l", "m": "ul", "x": "ll", "y": "ull"}.get(code, "")
    return "<literal>"


class _Unsupported(Exception):
    pass


class _Parser:
    def __init__(self, text: str):
        self.s, self.i = text, 0
        self.subs: list[str] = []
        self.template_args: list[str] = []

    def peek(self, n: int = 1) -> str:
        return self.s[self.i:self.i + n]

    def take(self, n: int = 1) -> str:
        out = self.s[self.i:self.i + n]
        if len(out) < n:
            raise _Unsupported("truncated")
        self.i += n
        return out

    def number(self) -> int:
        start = self.i
        while self.peek().isdigit():
            self.i += 1
        if start == self.i:
            raise _Unsupported(f"number expected at {self.i}")
        return int(self.s[start:self.i])

    def source_name(self) -> str:
        n = self.number()
        return self.take(n)

    def seq_id(self) -> int:
        """S_ = 0, S0_ = 1, S1_ = 2, ... (base 36)."""
        if self.peek() == "_":
            self.take()
            return 0
        start = self.i
        while self.peek() != "_":
            self.take()
        value = int(self.s[start:self.i], 36)
        self.take()
        return value + 1

    def substitution(self) -> str:
        self.take()  # S
        c = self.peek()
        if c == "t":
            self.take()
            return "std::"
        if c in "absoid":
            raise _Unsupported("std abbreviation")
        idx = self.seq_id()
        if idx >= len(self.subs):
            raise _Unsupported("bad substitution")
        return self.subs[idx]

    def template_param(self) -> str:
        self.take()  # T
        idx = self.seq_id()
        if idx >= len(self.template_args):
            raise _Unsupported("template parameter out of range")
        return self.template_args[idx]

    def template_args_list(self) -> list[str]:
        self.take()  # I
        args = []
        while self.peek() != "E":
            if self.peek() == "L":      # literal: L <type> <value> E
                self.take()
                start, depth = self.i, 1
                while depth:
                    ch = self.take()
                    depth += {"L": 1, "E": -1}.get(ch, 0)
                args.append(_literal(self.s[start:self.i - 1]))
            elif self.peek() == "X":
                raise _Unsupported("expression template argument")
            else:
                args.append(self.type())
        self.take()  # E
        return args

    def unqualified_name(self) -> str:
        if self.peek().isdigit():
            return self.source_name()
        raise _Unsupported(f"name form {self.peek()!r}")

    def name(self, is_function: bool = False) -> str:
        """A (possibly nested, possibly templated) name; records substitution candidates."""
        if self.peek() == "N":
            self.take()
            parts = ""
            while self.peek() != "E":
                if self.peek() == "S":
                    parts = self.substitution()
                    continue
                if self.peek() == "I":
                    args = self.template_args_list()
                    if is_function and self.peek() == "E":
                        self.template_args = args
                    parts += "<" + ", ".join(args) + ">"
                else:
                    if parts and not parts.endswith("::"):
                        parts += "::"
                    parts += self.unqualified_name()
                if self.peek() != "E" or not is_function:
                    self.subs.append(parts)
            self.take()  # E
            if not is_function and (not self.subs or self.subs[-1] != parts):
                self.subs.append(parts)
            return parts
        if self.peek() == "S":
            prefix = self.substitution()
            name = prefix + (self.unqualified_name() if prefix.endswith("::") else "")
            if prefix.endswith("::"):
                self.subs.append(name)
        else:
            name = self.unqualified_name()
            if not is_function:
                self.subs.append(name)
        if self.peek() == "I":
            if is_function:
                self.subs.append(name)      # the unscoped template name
            args = self.template_args_list()
            if is_function:
                self.template_args = args
            name += "<" + ", ".join(args) + ">"
            if not is_function:
                self.subs.append(name)
        return name

    def maybe_template_args(self, out: str) -> str:
        """`out<args...>` when template arguments follow (a new substitution candidate)."""
        if self.peek() == "I":
            out += "<" + ", ".join(self.template_args_list()) + ">"
            self.subs.append(out)
        return out

    def type(self) -> str:
        c = self.peek()
        if c in _BUILTIN:
            self.take()
            return _BUILTIN[c]
        if c == "D":
            for code, name in _D_BUILTIN.items():
                if self.s.startswith(code, self.i):
                    self.i += len(code)
                    return name
            raise _Unsupported("D-type")
        if c in "PR":
            self.take()
            inner = self.type()
            out = inner + ("*" if c == "P" else "&")
            self.subs.append(out)
            return out
        if c in "KVr":
            quals = ""
            while self.peek() in ("K", "V", "r"):
                q = self.take()
                quals += {"K": "const ", "V": "volatile ", "r": ""}[q]
            inner = self.type()
            out = quals + inner
            self.subs.append(out)
            return out
        if c == "T":
            out = self.template_param()
            self.subs.append(out)
            return self.maybe_template_args(out)
        if c == "S":
            out = self.substitution()
            if out.endswith("::"):  # St
                out += self.unqualified_name()
                self.subs.append(out)
            return self.maybe_template_args(out)
        if c.isdigit() or c == "N":
            return self.name()
        raise _Unsupported(f"type code {c!r}")


def parameter_types(mangled: str) -> list[str] | None:
    """The C parameter types of a mangled function name, or None if it can't be decoded."""
    decoded = _decode(mangled)
    return decoded[2] if decoded else None


def demangle(mangled: str) -> str | None:
    """`axpy<float>(float, const float*, float*, int)` for `_Z4axpyIfEvT_PKS0_PS0_i`, or None
    where the name is not one this decoder reads."""
    decoded = _decode(mangled)
    return f"{decoded[0]}({', '.join(decoded[2])})" if decoded else None


def function_name(mangled: str) -> tuple[str, bool] | None:
    """(the qualified name with its template arguments, whether it is a template
    instantiation): ("ns::axpy<float>", True), or None where it cannot be decoded."""
    decoded = _decode(mangled)
    return (decoded[0], decoded[1]) if decoded else None


def plain_names(qualified: str) -> tuple[str, ...]:
    """The names a C++ user calls a function by: `ns::axpy<float>` is also `ns::axpy` and
    `axpy` (template arguments dropped, then the namespaces)."""
    bare, depth = "", 0
    for ch in qualified:
        depth += ch == "<"
        if not depth:
            bare += ch
        depth -= ch == ">" and depth > 0
    last = bare.rsplit("::", 1)[-1]
    return tuple(dict.fromkeys((qualified, bare, last)))


def _decode(mangled: str) -> tuple[str, bool, list[str]] | None:
    """(qualified name, templated, parameter types) of a mangled function name."""
    if not mangled.startswith("_Z"):
        return None
    p = _Parser(mangled[2:])
    try:
        name = p.name(is_function=True)
        templated = bool(p.template_args)
        if templated:
            p.type()  # template functions encode their return type first
        params = []
        while p.i < len(p.s):
            if p.peek() == ".":   # clone suffix
                break
            t = p.type()
            if t == "void" and not params and p.i >= len(p.s):
                break
            params.append(t)
        return name, templated, params
    except (_Unsupported, ValueError):
        return None


# --- the kernel a C++ name means ---------------------------------------------------------

class KernelNameError(KernelNotFoundError):
    """No kernel of a module, or more than one, answers to a name. The message lists the
    module's kernels demangled and says how to pick one; `candidates` holds the lowered names
    of those the name could mean."""

    def __init__(self, name: str, available: Sequence[str], message: str,
                 candidates: Sequence[str] = ()):
        super().__init__(name, available)
        self.candidates = tuple(candidates)
        self.message = message

    def __str__(self) -> str:
        return self.message


def find_kernel(name: str, entry_points: Sequence[str], symbols: Mapping[str, str]) -> str:
    """The entry point that `name` means among a module's kernels: the one C++-linkage kernel
    called `name` with or without its namespaces and template arguments (`saxpy`, `ns::fill`,
    `fill<int>`) or its full signature (`saxpy(float*, int)`). KernelNameError when none is,
    or when several are (overloads, template instantiations)."""
    wanted = " ".join(name.split())
    found = []
    for symbol in entry_points:
        decoded = _decode(symbol)
        if decoded and (wanted in plain_names(decoded[0])
                        or wanted == f"{decoded[0]}({', '.join(decoded[2])})"):
            found.append(symbol)
    if len(found) == 1:
        return found[0]
    listed = [_shown(s) for s in entry_points] + [e for e in symbols if e not in entry_points]
    if not found:
        have = ", ".join(listed) if listed else "(none)"
        raise KernelNameError(name, listed, f"no kernel named {name!r} in this module; it has: {have}")
    exprs = [e for e in (_name_expression(s) for s in found) if e]
    lines = [f"kernel name {name!r} is ambiguous: {len(found)} kernels of this module are called "
             "that:"]
    lines += [f"  {demangle(s)}    lowered name {s}" for s in found]
    if exprs:
        lines.append("Pick one by its name expression: compile with kjit.compile(source, "
                     f"name_expressions={exprs!r}) and ask for module.get_function({exprs[0]!r}); "
                     "or ask for a lowered name above as it is.")
    else:
        lines.append("Pick one by asking for its lowered name above.")
    raise KernelNameError(name, listed, "\n".join(lines), found)


def _shown(symbol: str) -> str:
    """A kernel as an error lists it: `_Z5saxpyPfi (saxpy(float*, int))`, or the bare name."""
    readable = demangle(symbol)
    return f"{symbol} ({readable})" if readable else symbol


def _name_expression(symbol: str) -> str | None:
    """The NVRTC name expression that lowers to `symbol`: a template instantiation by its
    name (`axpy<float>`), an overload by a cast to its type (`static_cast<void(*)(int*)>(k)`)."""
    decoded = _decode(symbol)
    if decoded is None or "<literal>" in decoded[0] or any("<literal>" in t for t in decoded[2]):
        return None
    qualified, templated, params = decoded
    if templated:
        return qualified
    return f"static_cast<void(*)({', '.join(params)})>({qualified})"
