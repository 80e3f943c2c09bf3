"""The kernel signatures and plain struct definitions of a source, kept with its ObjectCode.

At load time kjit needs each parameter's C type to convert arguments exactly; the compiled
binary does not record it. compile() keeps this small digest of the source (not the source
itself) in the object's metadata, so a cached or saved object still knows its signatures.

The source is read as the compiler reads it, as far as a declaration's types go: line splices
joined, comments removed, `#if`/`#ifdef` branches known to be false dropped, and object-like
macros whose value is certain expanded. A macro whose value depends on something kjit cannot
see (a `-D` it was not told, a header) is left alone, so the types it names stay unknown rather
than guessed: CuPy's `#if PRECISION == 2 / #define TYPE double / #else / #define TYPE float`.
"""
from __future__ import annotations

import re
from typing import Any, Iterable, NamedTuple

# a string or character literal (kept: a `//` inside one is no comment), or a comment
_LEXEMES = re.compile(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'|//[^\n]*|/\*.*?\*/', re.S)
_SPLICE = re.compile(r"\\[ \t]*\r?\n")
# kept for callers that find kernels by regex (tune/keys.py): name and parameter text
KERNEL = re.compile(
    r"__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?"
    r"([A-Za-z_]\w*)\s*\(([^)]*)\)", re.S)


def strip_comments(source: str) -> str:
    """The source with line splices joined and each comment replaced by a space, as the
    compiler's first phases do (a comment cannot then hide a splice, nor a splice a comment)."""
    text = _SPLICE.sub("", source) if "\\" in source else source
    if "/" not in text:
        return text
    return _LEXEMES.sub(lambda m: m.group(0) if m.group(0)[0] in "\"'" else " ", text)


# --- the preprocessor, as far as declarations need it -----------------------------------------

_UNKNOWN = object()      # defined, or not, where kjit cannot tell; or to a value it cannot tell
_UNDEF = object()        # #undef'd: known not to be defined
_FUNCTION = object()     # a function-like macro: defined, never expanded here
_DIRECTIVE = re.compile(r"^\s*#\s*(\w*)(.*)$")
_DEFINE = re.compile(r"^\s*([A-Za-z_]\w*)(\()?\s*(.*)$")
_INT = re.compile(r"\b((?:0[xX][0-9a-fA-F]+)|\d+)[uUlL]*\b")
_ARITH = re.compile(r"^[\d\s()+\-*/%<>=!&|^~]*$")


class _Macros:
    def __init__(self, defines: Iterable[tuple[str, str | None]]):
        self.table: dict[str, object] = {}
        for name, value in defines:
            self.table[name] = "1" if value is None else str(value)
        self._pattern: re.Pattern | None = None

    def set(self, name: str, value: object) -> None:
        self.table[name] = value
        self._pattern = None

    def expand(self, text: str, disabled: frozenset = frozenset()) -> str:
        if self._pattern is None:
            names = [n for n, v in self.table.items() if isinstance(v, str)]
            self._pattern = re.compile(r"\b(?:" + "|".join(map(re.escape, names)) + r")\b") \
                if names else re.compile(r"(?!x)x")

        def one(m: re.Match) -> str:
            name = m.group(0)
            if name in disabled:   # a macro is not expanded inside its own expansion
                return name
            return self.expand(str(self.table[name]), disabled | {name})
        return self._pattern.sub(one, text)

    def defined(self, name: str) -> bool | None:
        v = self.table.get(name, _UNKNOWN)
        return None if v is _UNKNOWN else v is not _UNDEF

    def condition(self, expr: str) -> bool | None:
        """An #if expression's value, None where it depends on what kjit cannot see."""
        if "__has_" in expr or "'" in expr or "?" in expr:
            return None
        unknown = False

        def is_defined(m: re.Match) -> str:
            nonlocal unknown
            d = self.defined(m.group(1) or m.group(2))
            unknown |= d is None
            return "1" if d else "0"
        expr = re.sub(r"\bdefined\s*(?:\(\s*([A-Za-z_]\w*)\s*\)|([A-Za-z_]\w*))", is_defined, expr)
        expr = self.expand(expr)
        expr = re.sub(r"\btrue\b", "1", re.sub(r"\bfalse\b", "0", expr))
        expr = _INT.sub(lambda m: str(_c_int(m.group(1))), expr)
        if unknown or not _ARITH.match(expr) or "**" in expr or any(
                int(n) > 64 for n in re.findall(r"<<\s*(\d+)", expr)):
            return None   # an identifier kjit knows nothing of; no huge numbers made here
        expr = (expr.replace("&&", " and ").replace("||", " or ").replace("/", "//")
                .replace("!=", " <> ").replace("!", " not ").replace(" <> ", " != "))
        try:
            return bool(eval(expr, {"__builtins__": {}}, {}))  # digits and operators only
        except Exception:
            return None


def _c_int(digits: str) -> int:
    if digits[:2] in ("0x", "0X"):
        return int(digits, 16)
    return int(digits, 8) if digits.startswith("0") and len(digits) > 1 else int(digits)


def preprocess(source: str, defines: Iterable[tuple[str, str | None]] = ()) -> str:
    """The source without comments or directives: branches known false dropped, certain
    object-like macros expanded. `defines`: the compile's own (`-D`) macros, (name, value)."""
    text = strip_comments(source)
    macros = _Macros(defines)
    if "#" not in text and not macros.table:
        return text
    stack: list[list] = []          # per #if: [active, taken], each True, False or None
    out: list[str] = []
    for line in text.split("\n"):
        states = [s[0] for s in stack]
        live = False not in states
        sure = live and None not in states
        d = _DIRECTIVE.match(line)
        if d is None:
            if live:
                out.append(macros.expand(line) if macros.table else line)
            continue
        word, rest = d.group(1), d.group(2).strip()
        if word in ("if", "ifdef", "ifndef"):
            if not live:
                c = False
            elif word == "if":
                c = macros.condition(rest)
            else:
                name = rest.split()[0] if rest.split() else ""
                c = macros.defined(name)
                c = c if c is None or word == "ifdef" else not c
            stack.append([c, c])
        elif word == "elif" and stack:
            top = stack[-1]
            c = macros.condition(rest) if False not in [s[0] for s in stack[:-1]] else False
            if top[1] is True:
                top[0] = False
            elif top[1] is False:
                top[0] = top[1] = c
            else:
                top[0] = False if c is False else None
                top[1] = True if c is True else None
        elif word == "else" and stack:
            top = stack[-1]
            top[0] = None if top[1] is None else not top[1]
            top[1] = True if top[1] is not None else None
        elif word == "endif" and stack:
            stack.pop()
        elif word == "define" and live:
            m = _DEFINE.match(rest)
            if m:
                value: object = _FUNCTION if m.group(2) else m.group(3).strip()
                if not sure and macros.table.get(m.group(1)) != value:
                    value = _UNKNOWN
                macros.set(m.group(1), value)
        elif word == "undef" and live and rest:
            macros.set(rest.split()[0], _UNDEF if sure else _UNKNOWN)
        out.append("")              # a directive keeps its line, so lines still count
    return "\n".join(out)


# --- declarations ------------------------------------------------------------------------------

# `typedef T name;` and `using name = T;` for T a type name, template arguments allowed (no
# pointer or array): llm.c's `typedef __nv_bfloat16 floatX;` and kernels taking floatX*
ALIAS = re.compile(r"\btypedef\s+([A-Za-z_:][\w:\s<>,]*?)\s+([A-Za-z_]\w*)\s*;|"
                   r"\busing\s+([A-Za-z_]\w*)\s*=\s*([A-Za-z_:][\w:\s<>,]*?)\s*;")


def aliases(text: str) -> dict[str, str]:
    """The plain type aliases of a preprocessed source: name -> the type it stands for. A name
    aliased to two different types (in branches kjit could not decide) is left out."""
    out: dict[str, str] = {}
    clash: set[str] = set()
    for m in ALIAS.finditer(text):
        name, target = (m.group(2), m.group(1)) if m.group(2) else (m.group(3), m.group(4))
        target = " ".join(target.split())
        if not target or target.startswith("enum"):
            continue
        if out.get(name, target) != target:
            clash.add(name)
        out[name] = target
    return {k: v for k, v in out.items() if k not in clash}


# attribute-like words that take a parenthesised argument before a kernel's name
_ATTRIBUTES = {"__launch_bounds__", "__cluster_dims__", "__maxnreg__", "__attribute__",
               "__declspec", "alignas", "__align__", "__block_size__"}
_GLOBAL = re.compile(r"\b__global__\b")
_NAME_PAREN = re.compile(r"([A-Za-z_][\w:]*)\s*\(|\[\[|[;{}]")


class Kernel(NamedTuple):
    name: str
    params: tuple[str, ...]     # each parameter's declaration, whitespace collapsed
    template: bool


def _close(text: str, i: int, open_: str = "(", close: str = ")") -> int:
    """The index just past the bracket that closes the one at text[i]."""
    depth = 0
    for j in range(i, len(text)):
        c = text[j]
        if c == open_:
            depth += 1
        elif c == close:
            depth -= 1
            if depth == 0:
                return j + 1
    return len(text)


def split_params(text: str) -> list[str]:
    """A parameter list split at its top-level commas (not those inside template arguments,
    brackets or a default argument's parentheses)."""
    out, cur, depth, angle, default = [], [], 0, 0, False
    for c in text:
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "=" and depth == 0 and angle == 0:
            default = True
        elif c == "<" and not default:
            angle += 1
        elif c == ">" and not default and angle:
            angle -= 1
        elif c == "," and depth == 0 and angle == 0:
            out.append("".join(cur))
            cur, default = [], False
            continue
        cur.append(c)
    out.append("".join(cur))
    # a backslash outside a literal is a splice, joined already; a digest written before
    # splices were joined holds one followed by a space
    return [" ".join(p.replace("\\", " ").split()) for p in out if p.strip(" \t\n\\")]


def kernels(text: str) -> list[Kernel]:
    """Every `__global__` function declared in a preprocessed source."""
    out = []
    for g in _GLOBAL.finditer(text):
        # the declaration's start: after the last ; { } before it (template headers have none)
        head = text[max(0, g.start() - 2000):g.start()]
        start = max(head.rfind(";"), head.rfind("{"), head.rfind("}")) + 1
        template = re.search(r"\btemplate\b", head[start:]) is not None
        i = g.end()
        while True:
            m = _NAME_PAREN.search(text, i)
            if m is None or m.group(0) in ";{}":
                break
            if m.group(0) == "[[":
                i = _close(text, m.start(), "[", "]")
                continue
            paren = m.end() - 1
            if m.group(1) in _ATTRIBUTES or m.group(1).split("::")[-1] == "void":
                i = _close(text, paren)
                continue
            end = _close(text, paren)
            name = m.group(1).split("::")[-1]
            out.append(Kernel(name, tuple(split_params(text[paren + 1:end - 1])), template))
            break
    return out


_STRUCT = re.compile(r"\b(typedef\s+)?(struct|class)\b")
_ALIGN = re.compile(r"(?:__align__|alignas)\s*\(\s*(\w+)\s*\)|"
                    r"__attribute__\s*\(\(\s*(?:__)?aligned(?:__)?\s*\(\s*(\w+)\s*\)\s*\)\)|"
                    r"__declspec\s*\(\s*align\s*\(\s*(\w+)\s*\)\s*\)|\[\[[^\]]*\]\]")
_SKIP_MEMBER = re.compile(r"^(?:static|using|typedef|friend|template|enum|__device__|__host__|"
                          r"constexpr|inline)\b")
_LABEL = re.compile(r"^(?:(?:public|private|protected)\s*:\s*)+")


class Struct(NamedTuple):
    names: tuple[str, ...]      # its tag and typedef names
    align: int                  # an explicit alignment (0: none)
    members: tuple[str, ...] | None   # one declarator each: "float4 v", "int c[2]"; None: unusable


def _alignment(attrs: str) -> int | None:
    """The largest explicit alignment among attributes, 0 for none, None if not a number."""
    best = 0
    for m in _ALIGN.finditer(attrs):
        n = m.group(1) or m.group(2) or m.group(3)
        if n is None:
            continue
        if not n.isdigit():
            return None
        best = max(best, int(n))
    return best


def _members(body: str) -> tuple[str, ...] | None:
    """A struct body's data members, one declarator each; None if its layout is beyond a plain
    reading (bit-fields, virtual functions, function pointers, nested definitions)."""
    segments, cur, depth, saw_paren = [], [], 0, False
    for c in body:
        cur.append(c)
        if c in "({":
            depth += 1
            saw_paren |= c == "("
        elif c in ")}":
            depth -= 1
            if c == "}" and depth == 0 and saw_paren:   # a member function's body ends it
                segments.append(""), cur.clear()
                saw_paren = False
        elif c == ";" and depth == 0:
            segments.append("".join(cur[:-1])), cur.clear()
            saw_paren = False
    out: list[str] = []
    for seg in (" ".join(s.split()) for s in segments + ["".join(cur)]):
        seg = _LABEL.sub("", re.sub(r"^(?:\{[^{}]*\}\s*)+", "", seg))
        if not seg or seg.startswith("{") or _SKIP_MEMBER.match(seg):
            continue
        if re.search(r"\b(?:virtual|struct|class|union)\b\s*(?:\w+\s*)?\{|\bvirtual\b|\(\s*[*&]", seg):
            return None
        align = _alignment(seg)
        plain = _ALIGN.sub(" ", seg)
        if re.search(r"\b(?:alignas|__align__|__attribute__|__declspec)\b", plain):
            return None   # an alignment kjit cannot compute: alignas(sizeof(T) * 2)
        if "(" in plain or "operator" in plain:    # a member function or constructor
            continue
        if align is None or re.search(r"(?<!:):(?!:)", plain):   # alignas(T), a bit-field
            return None
        decls = split_params(plain)
        first = re.match(r"^(.*?)([*&\s]*)([A-Za-z_]\w*)\s*((?:\[[^\]]*\]\s*)*)(?:[={].*)?$", decls[0])
        if first is None:
            return None
        base = first.group(1).strip()
        prefix = f"__align__({align}) " if align else ""
        for i, d in enumerate(decls):
            m = first if i == 0 else re.match(
                r"^()([*&\s]*)([A-Za-z_]\w*)\s*((?:\[[^\]]*\]\s*)*)(?:[={].*)?$", d)
            if m is None or not base:
                return None
            out.append(f"{prefix}{base}{m.group(2).replace(' ', '')} {m.group(3)}"
                       f"{''.join(m.group(4).split())}")
    return tuple(out)


def structs(text: str) -> list[Struct]:
    """The struct and class definitions of a preprocessed source."""
    out = []
    for m in _STRUCT.finditer(text):
        if text[max(0, m.start() - 8):m.start()].rstrip().endswith("enum"):
            continue   # enum class
        i = m.end()
        attrs = []
        while True:   # attributes, then the tag, then `final`, then a base clause or the body
            a = _ALIGN.match(text, i) or re.compile(r"\s+").match(text, i)
            if a is None or a.end() == i:
                break
            attrs.append(a.group(0))
            i = a.end()
        tag = re.compile(r"([A-Za-z_]\w*)\s*").match(text, i)
        if tag and tag.group(1) not in ("final",):
            i = tag.end()
        while True:
            a = _ALIGN.match(text, i) or re.compile(r"\s+|final\b").match(text, i)
            if a is None or a.end() == i:
                break
            attrs.append(a.group(0))
            i = a.end()
        if i >= len(text) or text[i] not in "{:":
            continue   # a use of the type, or a forward declaration
        end = _close(text, text.find("{", i), "{", "}") if "{" in text[i:] else len(text)
        body = text[text.find("{", i) + 1:end - 1]
        semi = text.find(";", end)
        tail = text[end:semi if semi >= 0 else len(text)]
        names = [tag.group(1)] if tag and tag.group(1) != "final" else []
        if m.group(1):   # typedef struct ... { } Name, *PName;
            names += [n.strip() for n in _ALIGN.sub(" ", tail).split(",")
                      if re.fullmatch(r"\s*[A-Za-z_]\w*\s*", n)]
        align = _alignment("".join(attrs) + tail)
        members = None if text[i] == ":" or align is None else _members(body)
        if names:
            out.append(Struct(tuple(dict.fromkeys(names)), align or 0, members))
    return out


def macros_of(options: Any) -> list[tuple[str, str | None]]:
    """The macros a compile defines on its command line: a CompileOptions' `defines`, and the
    `-DNAME[=value]` / `--define-macro=...` flags among its `extra` (a later one wins)."""
    out = list(getattr(options, "defines", ()))
    flags = list(getattr(options, "extra", ()))
    for i, flag in enumerate(flags):
        m = re.fullmatch(r"(?:-D|--define-macro=?)(.*)", flag)
        if m is None:
            continue
        text = m.group(1) or (flags[i + 1] if i + 1 < len(flags) else "")
        name, eq, value = text.partition("=")
        if re.fullmatch(r"[A-Za-z_]\w*", name):
            out.append((name, value if eq else None))
    return out


def extract(source: str, defines: Iterable[tuple[str, str | None]] = ()) -> str:
    """A minimal source holding the plain type aliases, struct definitions and non-template
    kernel signatures of `source` as the compiler reads it (`defines`: the compile's `-D`
    macros, (name, value) pairs); cdecl reads it back the same way."""
    text = preprocess(source, defines)
    parts = []
    for s in structs(text):
        if s.members is not None:
            align = f"__align__({s.align}) " if s.align else ""
            parts.append(f"struct {align}{s.names[0]} {{ {' '.join(m + ';' for m in s.members)} }};")
            parts += [f"typedef struct {s.names[0]} {n};" for n in s.names[1:]]
    parts[:0] = [f"typedef {target} {name};" for name, target in aliases(text).items()]
    for k in kernels(text):
        if not k.template:
            parts.append(f"__global__ void {k.name}({', '.join(k.params)}) {{}}")
    return "\n".join(parts)
