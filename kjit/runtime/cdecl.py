"""C types of kernel parameters: the type table, and parsers for kernel signatures and
plain structs in CUDA source, with the device's alignment rules (float4 aligned to 16...)."""
from __future__ import annotations

import re
from typing import Any, NamedTuple

from . import dtypes


class CType(NamedTuple):
    """A parameter's C type as the device lays it out."""

    name: str                 # "float", "float4", "const float*", "struct S"
    size: int
    align: int
    kind: str                 # "int", "uint", "float", "bool", "pointer", "vector", "struct"
    typestr: str | None = None          # numpy typestr of scalars, vector lanes, pointees
    fields: tuple = ()                  # struct/vector: ((name, offset, CType), ...)
    const: bool = False                 # pointers: pointee is const
    count: int = 1                      # vectors: lanes


def _scalar(name: str, typestr: str, kind: str) -> CType:
    size = dtypes.resolve(typestr)[1]
    return CType(name, size, size, kind, typestr)


SCALARS: dict[str, CType] = {}
for _names, _dt, _kind in [
    (("char", "signed char", "int8_t"), "|i1", "int"),
    (("unsigned char", "uint8_t", "uchar"), "|u1", "uint"),
    (("short", "short int", "signed short", "int16_t"), "<i2", "int"),
    (("unsigned short", "unsigned short int", "uint16_t", "ushort"), "<u2", "uint"),
    (("int", "signed", "signed int", "int32_t"), "<i4", "int"),
    (("unsigned", "unsigned int", "uint32_t", "uint"), "<u4", "uint"),
    (("long", "long int", "long long", "long long int", "signed long long", "int64_t",
      "ptrdiff_t", "ssize_t", "intptr_t"), "<i8", "int"),
    (("unsigned long", "unsigned long int", "unsigned long long", "unsigned long long int",
      "uint64_t", "size_t", "uintptr_t", "ulong"), "<u8", "uint"),
    (("float",), "<f4", "float"),
    (("double",), "<f8", "float"),
    (("__half", "half", "__nv_half"), "<f2", "float"),
    (("bool",), "|b1", "bool"),
]:
    for _n in _names:
        SCALARS[_n] = _scalar(_n, _dt, _kind)

# CUDA's built-in vector types: (base, lanes, alignment) per the CUDA C++ guide.
_VECTOR_ALIGN = {("char", 1): 1, ("char", 2): 2, ("char", 3): 1, ("char", 4): 4,
                 ("short", 1): 2, ("short", 2): 4, ("short", 3): 2, ("short", 4): 8,
                 ("int", 1): 4, ("int", 2): 8, ("int", 3): 4, ("int", 4): 16,
                 ("long", 1): 8, ("long", 2): 16, ("long", 3): 8, ("long", 4): 16,
                 ("longlong", 1): 8, ("longlong", 2): 16, ("longlong", 3): 8, ("longlong", 4): 16,
                 ("float", 1): 4, ("float", 2): 8, ("float", 3): 4, ("float", 4): 16,
                 ("double", 1): 8, ("double", 2): 16, ("double", 3): 8, ("double", 4): 16}
_VECTOR_BASE = {"char": ("|i1", "int"), "uchar": ("|u1", "uint"), "short": ("<i2", "int"),
                "ushort": ("<u2", "uint"), "int": ("<i4", "int"), "uint": ("<u4", "uint"),
                "long": ("<i8", "int"), "ulong": ("<u8", "uint"), "longlong": ("<i8", "int"),
                "ulonglong": ("<u8", "uint"), "float": ("<f4", "float"), "double": ("<f8", "float")}
VECTORS: dict[str, CType] = {}
for _base, (_dt, _kind) in _VECTOR_BASE.items():
    for _lanes in (1, 2, 3, 4):
        _al = _VECTOR_ALIGN[(_base.removeprefix("u") if _base != "uchar" else "char", _lanes)]
        _lane = next(c for c in SCALARS.values() if c.typestr == _dt and c.kind == _kind)
        _fields = tuple((c, i * _lane.size, _lane) for i, c in enumerate("xyzw"[:_lanes]))
        _size = -(-(_lane.size * _lanes) // _al) * _al
        VECTORS[f"{_base}{_lanes}"] = CType(f"{_base}{_lanes}", _size, _al, "vector", _dt,
                                            _fields, count=_lanes)

POINTER_SIZE = 8
# pointees numpy has no dtype for (dtypes.EXTRA): CUDA's and HIP's names for them
POINTEES = {"__nv_bfloat16": "bfloat16", "nv_bfloat16": "bfloat16", "__hip_bfloat16": "bfloat16",
            "hip_bfloat16": "bfloat16", "__nv_fp8_e4m3": "float8_e4m3fn",
            "__nv_fp8_e5m2": "float8_e5m2", "__nv_fp8_e8m0": "float8_e8m0fnu"}

# complex numbers: cuComplex.h's are float2 / double2 (aligned 8 / 16); thrust::complex,
# cuda::std::complex and c10::complex are `alignas(2 * sizeof(T))`, CuPy's complex<T> is thrust's
COMPLEX: dict[str, CType] = {}
for _names, _dt in [(("cuComplex", "cuFloatComplex", "hipComplex", "hipFloatComplex",
                      "complex<float>"), "<c8"),
                    (("cuDoubleComplex", "hipDoubleComplex", "complex<double>"), "<c16")]:
    for _n in _names:
        _size = dtypes.resolve(_dt)[1]
        _part = SCALARS["float" if _size == 8 else "double"]
        COMPLEX[_n] = CType(_n, _size, _size, "complex", _dt,
                            (("real", 0, _part), ("imag", _part.size, _part)))
# the namespaces a complex<T> is spelled with, libcu++'s versioned inline one (__4) included
_COMPLEX_NS = re.compile(r"^(?:(?:thrust|cuda|std|c10|__\d+)::)+(?=complex<)")

_QUALIFIERS = re.compile(r"\b(__restrict__|__restrict|restrict|volatile|__grid_constant__|"
                         r"struct|class|typename|register)\b|\[\[[^\]]*\]\]|"
                         r"(?:__align__|alignas)\s*\(\s*\w*\s*\)|__attribute__\s*\(\((?:[^()]|\([^()]*\))*\)\)")
_CONST = re.compile(r"\bconst\b")
_INTEGER_WORDS = {"signed", "unsigned", "short", "long", "int", "char"}


def _base_name(text: str) -> str:
    """A type name as written, qualifiers and namespaces the tables do not use removed:
    `std::size_t` -> size_t, `::thrust::complex< float >` -> complex<float>, `long unsigned`
    -> unsigned long (C allows the words in any order)."""
    base = " ".join(_CONST.sub(" ", text).split())
    base = re.sub(r"\s*([<>,])\s*", r"\1", base).removeprefix("::")
    base = _COMPLEX_NS.sub("", base).removeprefix("std::")
    words = base.split()
    if len(words) > 1 and set(words) <= _INTEGER_WORDS:
        sign = [w for w in words if w in ("signed", "unsigned")]
        size = [w for w in words if w not in ("signed", "unsigned")]
        if size == ["int"] or not size:
            size = ["int"]
        elif "int" in size and len(size) > 1:
            size = [w for w in size if w != "int"]
        base = " ".join(sign + size)
    return base


def _known(base: str, structs: dict[str, CType] | None) -> CType | None:
    return SCALARS.get(base) or VECTORS.get(base) or COMPLEX.get(base) or (structs or {}).get(base)


def parse_type(text: str, structs: dict[str, CType] | None = None,
               aliases: dict[str, str] | None = None) -> CType | None:
    """A CType for a declaration's type text (`const float* __restrict__`), or None if unknown;
    `aliases` are the source's plain typedefs (declarations.aliases)."""
    text = _QUALIFIERS.sub(" ", text)
    stars = text.count("*") + text.count("&")
    const = bool(_CONST.search(text.split("*")[0])) if stars else False
    base = _base_name(text.replace("*", " ").replace("&", " "))
    for _ in range(8):   # an alias of an alias...
        if not aliases or base not in aliases:
            break
        target = _QUALIFIERS.sub(" ", aliases[base])
        if "*" in target or "&" in target:
            return None   # an alias of a pointer type: the digest keeps plain aliases only
        base = _base_name(target)
    if stars:
        pointee = _known(base, structs)
        # float4*: an array of float32 lanes; T**: an array of device addresses, whatever T is
        typestr = None if stars != 1 else pointee.typestr if pointee is not None else \
            POINTEES.get(base)
        return CType(" ".join(text.split()), POINTER_SIZE, POINTER_SIZE, "pointer", typestr,
                     const=const)
    return _known(base, structs)


class Param(NamedTuple):
    name: str
    decl: str                  # the declaration as written
    ctype: CType | None        # None: unknown type (layout comes from the driver)


class Signature(NamedTuple):
    kernel: str
    params: tuple[Param, ...] = ()


from ..compiler import declared_aliases, declared_kernels, declared_structs, preprocess_declarations


def aliases_of(source: str) -> dict[str, str]:
    """The plain type aliases of a source (or a declarations digest)."""
    return declared_aliases(preprocess_declarations(source))

# patterns used off the common path stay strings: re compiles (and caches) them on first use
_FIELD = r"^(?:__align__\((\d+)\)\s*)?(.*?)([A-Za-z_]\w*)\s*((?:\[\s*\d+\s*\])*)$"


def _array(elem: CType, count: int) -> CType:
    """`T name[count]` as a struct field: `count` elements of T, aligned as T."""
    return CType(f"{elem.name}[{count}]", elem.size * count, elem.align, "array", elem.typestr,
                 (("", 0, elem),), count=count)


def parse_structs(source: str, named: dict[str, str] | None = None) -> dict[str, CType]:
    """Plain structs defined in the source, laid out with device alignment.

    Fields must be scalars, vectors, complex numbers, pointers, earlier structs or fixed
    arrays of those; anything else leaves the struct out (its layout then comes from the
    driver's sizes). `named`: the source's plain type aliases, where the caller has them.
    """
    structs: dict[str, CType] = {}
    text = preprocess_declarations(source)
    named = declared_aliases(text) if named is None else named
    for s in declared_structs(text):
        if s.members is None:
            continue
        fields_, offset, max_align = [], 0, max(1, s.align)
        for decl in s.members:
            fm = re.match(_FIELD, decl)
            ctype = parse_type(fm.group(2), structs, named) if fm and fm.group(2).strip() else None
            if ctype is None:
                break
            dims = [int(d) for d in re.findall(r"\d+", fm.group(4))]
            if dims:
                count = 1
                for d in dims:
                    count *= d
                ctype = _array(ctype, count)
            align = max(ctype.align, int(fm.group(1) or 1))
            offset = -(-offset // align) * align
            fields_.append((fm.group(3), offset, ctype))
            offset += ctype.size
            max_align = max(max_align, align)
        else:
            size = -(-offset // max_align) * max_align
            ctype = CType(f"struct {s.names[0]}", size, max_align, "struct", None, tuple(fields_))
            for n in s.names:
                structs[n] = ctype
    return structs


# a parameter's last word is its type, not its name (an unnamed parameter: `unsigned char`)
_TYPE_WORDS = {"char", "short", "int", "long", "float", "double", "signed", "unsigned", "bool",
               "half", "size_t"} | set(VECTORS) | set(COMPLEX)


def _param(i: int, decl: str, structs: dict[str, CType], named: dict[str, str]) -> Param:
    """One parameter's name and type from its declaration: `const float* __restrict__ x`,
    `float x[]` (a pointer), `unsigned int` (unnamed), `int n = 4` (a default)."""
    text = decl.split("=")[0]
    text = _QUALIFIERS.sub(" ", text).strip()
    array = re.search(r"\[[^\]]*\]\s*$", text)
    if array:   # an array parameter is a pointer
        text = text[:array.start()].rstrip() + " *"
        pm = re.match(r"^(.*?)([A-Za-z_]\w*)\s*\*$", text)
        if pm and pm.group(1).strip():
            return Param(pm.group(2), decl, parse_type(pm.group(1) + "*", structs, named))
        return Param(f"arg{i}", decl, parse_type(text, structs, named))
    pm = re.match(r"^(.*?)([A-Za-z_]\w*)\s*$", text)
    if pm and pm.group(2) not in _TYPE_WORDS and pm.group(1).strip() and \
            not pm.group(1).strip().endswith(("::", "<", ",")):
        ctype = parse_type(pm.group(1), structs, named)
        whole = None if ctype is not None else parse_type(text, structs, named)
        if whole is not None:   # `const S`: S is the type, the parameter has no name
            return Param(f"arg{i}", decl, whole)
        return Param(pm.group(2), decl, ctype)
    return Param(f"arg{i}", decl, parse_type(text, structs, named))


def parse_signatures(source: str) -> dict[str, Signature]:
    """Signatures of the non-template kernels in the source, by kernel name, read as the
    compiler reads them (declarations.preprocess). Templates are left to the mangled-name
    decoder and the driver."""
    text = preprocess_declarations(source)
    named = declared_aliases(text)
    structs = parse_structs(text, named)
    out: dict[str, Signature] = {}
    for k in declared_kernels(text):
        if k.template:
            continue
        params = k.params if k.params not in ((), ("void",)) else ()
        out[k.name] = Signature(k.name, tuple(_param(i, d, structs, named)
                                              for i, d in enumerate(params)))
    return out


def struct_dtype(ctype: CType) -> Any:
    """A numpy dtype with the device layout of a struct or vector (offsets and padding)."""
    names, formats, offsets = [], [], []
    for fname, off, ft in ctype.fields:
        names.append(fname)
        formats.append(_field_format(ft))
        offsets.append(off)
    return dtypes.numpy().dtype({"names": names, "formats": formats, "offsets": offsets,
                     "itemsize": ctype.size})


def _field_format(ft: CType) -> Any:
    if ft.kind == "array":
        return (_field_format(ft.fields[0][2]), (ft.count,))
    if ft.kind in ("struct", "vector"):
        return struct_dtype(ft)
    return "<u8" if ft.kind == "pointer" else ft.typestr


# --- PTX .entry parameter types: for code loaded without its source (a .ptx file, a fatbin) --

_PTX_ENTRY = r"(?s)\.entry\s+([\w$]+)\s*\(([^)]*)\)"
_PTX_PARAM = r"\.param\s+(?:\.align\s+\d+\s+)?\.(\w+)\s+[\w$]+\s*(?:\[\s*(\d+)\s*\])?"
# PTX keeps only widths: NVRTC writes .u32 for int and unsigned alike, .u64 for pointers and
# 64-bit integers. A 64-bit parameter therefore accepts device arrays, kjit.ptr and numpy
# integers, but not a bare Python int (pointer or integer? kjit will not guess).
WORD64 = CType("64-bit value (pointer or integer)", 8, 8, "word64", "<u8")
_PTX_TYPES = {"f32": SCALARS["float"], "f64": SCALARS["double"], "f16": SCALARS["__half"],
              "u32": SCALARS["int"], "s32": SCALARS["int"], "b32": SCALARS["int"],
              "u16": SCALARS["short"], "s16": SCALARS["short"], "b16": SCALARS["short"],
              "u8": SCALARS["char"], "s8": SCALARS["char"], "b8": SCALARS["char"],
              "u64": WORD64, "s64": WORD64, "b64": WORD64}


def ptx_param_types(ptx: bytes | str, entry: str) -> list[CType | None] | None:
    """The parameter types PTX declares for kernel `entry` (None per aggregate parameter)."""
    text = ptx.decode("utf-8", "replace") if isinstance(ptx, bytes) else ptx
    for m in re.finditer(_PTX_ENTRY, text):
        if m.group(1) != entry:
            continue
        out: list[CType | None] = []
        for decl in (d for d in m.group(2).split(",") if d.strip()):
            pm = re.search(_PTX_PARAM, decl)
            if pm is None:
                return None
            out.append(None if pm.group(2) else _PTX_TYPES.get(pm.group(1)))
        return out
    return None
