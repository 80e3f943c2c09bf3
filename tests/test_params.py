"""The parameter buffer and argument checks, on the CPU: layouts follow the device's
alignment rules, and every bad argument is refused with the parameter's name."""
from __future__ import annotations

import ctypes
import struct

import numpy as np
import pytest

from kjit.errors import ArgumentError
from kjit.runtime.cdecl import parse_signatures, parse_structs, parse_type, struct_dtype
from kjit.runtime.mangled import parameter_types
from kjit.runtime.params import Packer, convert, layout, ptr


def packer_for(src: str, name: str) -> Packer:
    sig = parse_signatures(src)[name]
    slots = layout([p.ctype for p in sig.params], [p.name for p in sig.params], None)
    return Packer(name, slots, device=0)


def _packers() -> list:
    """The packing step's two forms: the C packer when built, and Python alone (None)."""
    from kjit.runtime.libcuda import c_function
    pack = c_function("pack")
    return [pack, None] if pack is not None else [None]


SEED002 = r'''extern "C" __global__ void params(int i, float4 f4, char c, float f, float* out, float2 f2) {}'''


def test_seed002_layout_and_bytes():
    pk = packer_for(SEED002, "params")
    assert [(s.offset, s.size) for s in pk.slots] == [(0, 4), (16, 16), (32, 1), (36, 4), (40, 8), (48, 8)]
    values = pk.convert_all((-7, (1.0, 2.0, 3.0, 4.0), 65, 0.5, ptr(0x1000), (5.0, 6.0)), [])
    buf = bytearray(pk.size)
    pk.struct.pack_into(buf, 0, *values)
    assert struct.unpack_from("<i", buf, 0)[0] == -7
    assert struct.unpack_from("<4f", buf, 16) == (1.0, 2.0, 3.0, 4.0)
    assert buf[32] == 65
    assert struct.unpack_from("<f", buf, 36)[0] == 0.5
    assert struct.unpack_from("<Q", buf, 40)[0] == 0x1000
    assert struct.unpack_from("<2f", buf, 48) == (5.0, 6.0)


def test_struct_device_layout_differs_from_host():
    structs = parse_structs("typedef struct { float f; float4 f4; } myStruct;")
    s = structs["myStruct"]
    assert (s.size, s.align) == (32, 16)
    assert struct_dtype(s).fields["f4"][1] == 16

    class F4(ctypes.Structure):
        _fields_ = [(c, ctypes.c_float) for c in "xyzw"]

    class Host(ctypes.Structure):
        _fields_ = [("f", ctypes.c_float), ("f4", F4)]
    pk = packer_for("typedef struct { float f; float4 f4; } myStruct;\n"
                    'extern "C" __global__ void k(myStruct s) {}', "k")
    raw = pk.convert_all((Host(1.0, F4(2, 3, 4, 5)),), [])[0]
    assert len(raw) == 32
    assert struct.unpack_from("<f", raw, 0)[0] == 1.0
    assert struct.unpack_from("<4f", raw, 16) == (2, 3, 4, 5)


def test_float_goes_in_as_float32_and_int_as_int32():
    pk = packer_for(r'extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {}', "saxpy")
    assert pk.format == "<f4xQQi"   # x aligned to 8 after the float
    for pack in _packers():
        buf = ctypes.create_string_buffer(pk.size)
        pk.filler(buf, pack)((2.0, ptr(16), ptr(32), 7), [])
        assert struct.unpack_from("<f4xQQi", buf.raw) == (2.0, 16, 32, 7)


@pytest.mark.parametrize("value, match", [
    (2**31, "does not fit"), (1.5, "expected an integer"), ("3", "expected an integer"),
])
def test_int_parameter_refuses(value, match):
    pk = packer_for(r'extern "C" __global__ void k(int n) {}', "k")
    with pytest.raises(ArgumentError, match=match) as err:
        pk.convert_all((value,), [])
    assert "'n'" in str(err.value)


def test_float_parameter_checks():
    pk = packer_for(r'extern "C" __global__ void k(float a, __half h) {}', "k")
    with pytest.raises(ArgumentError, match="exactly"):
        pk.convert_all((2**24 + 1, 1.0), [])
    with pytest.raises(ArgumentError, match="overflows"):
        pk.convert_all((1e39, 1.0), [])
    with pytest.raises(ArgumentError, match="overflows"):
        pk.convert_all((1.0, 70000.0), [])
    assert pk.convert_all((np.float32(1.5), np.float16(2)), []) == [1.5, 2.0]


def test_pointer_parameter_refuses_host_arrays_and_bare_ints():
    pk = packer_for(r'extern "C" __global__ void k(const float* x) {}', "k")
    with pytest.raises(ArgumentError, match="kjit.to_device"):
        pk.convert_all((np.ones(3, np.float32),), [])
    with pytest.raises(ArgumentError, match="kjit.ptr"):
        pk.convert_all((12345,), [])
    with pytest.raises(ArgumentError, match="takes 1 arguments"):
        pk.convert_all((), [])


class FakeCAI:
    """A foreign array described only by __cuda_array_interface__ (address 0: never dereferenced)."""

    def __init__(self, typestr, shape=(4,), strides=None):
        self.__cuda_array_interface__ = {"data": (0, False), "typestr": typestr, "shape": shape,
                                         "strides": strides, "version": 3}


def test_cuda_array_interface_dtype_and_strides_are_checked():
    pk = packer_for(r'extern "C" __global__ void k(double* x) {}', "k")
    with pytest.raises(ArgumentError, match="float32"):
        pk.convert_all((FakeCAI("<f4"),), [])
    with pytest.raises(ArgumentError, match="C-contiguous"):
        pk.convert_all((FakeCAI("<f8", (4,), (16,)),), [])


def test_unknown_types_accept_only_unambiguous_values():
    slots = layout([None], ["arg0"], [(0, 4)])
    pk = Packer("k", slots, 0)
    with pytest.raises(ArgumentError, match="ambiguous"):
        pk.convert_all((1.0,), [])
    assert pk.convert_all((np.float32(1.0),), [])[0] == struct.pack("<f", 1.0)


def test_driver_size_disagreement_is_an_error():
    with pytest.raises(ArgumentError, match="driver says"):
        layout([parse_type("double")], ["x"], [(0, 4)])


@pytest.mark.parametrize("mangled, expected", [
    ("_Z4axpyIfEvT_PKS0_PS0_i", ["float", "const float*", "float*", "int"]),
    ("_Z6unrollIfLi4EEvPT_PKS0_m", ["float*", "const float*", "unsigned long"]),
    ("_Z5plainf6float4PK1PS0_N2ns1QEh", ["float", "float4", "const P*", "P", "ns::Q", "unsigned char"]),
    ("_Z3twoIifEvT_T0_PKS0_PKS1_PS0_", ["int", "float", "const int*", "const float*", "int*"]),
    ("_Z6nestedN2ns1WIfEEPKS1_x", ["ns::W<float>", "const ns::W<float>*", "long long"]),
])
def test_mangled_parameter_types(mangled, expected):
    assert parameter_types(mangled) == expected


def test_mangled_names_from_nvrtc_round_trip(template_src):
    import kjit
    obj = kjit.compile(template_src, arch="sm_90", name_expressions=["axpy<double>"])
    assert parameter_types(obj.symbols["axpy<double>"]) == ["double", "const double*", "double*", "int"]


def test_ptx_parameter_types_for_code_loaded_without_source():
    from pathlib import Path

    from kjit.runtime.cdecl import ptx_param_types
    ptx = (Path(__file__).parent / "data" / "skew" / "cube.ptx").read_bytes()
    types = ptx_param_types(ptx, "cube")
    assert [t.kind for t in types] == ["word64", "word64", "int"]
    pk = Packer("cube", layout(types, ["x", "y", "n"], None), 0)
    assert pk.convert_all((ptr(16), ptr(32), 5), []) == [16, 32, 5]
    with pytest.raises(ArgumentError, match="kjit.ptr"):   # a bare int: pointer or integer?
        pk.convert_all((16, ptr(32), 5), [])
    assert ptx_param_types(ptx, "no_such_kernel") is None


def test_array_on_another_device_is_refused():
    from kjit.runtime.memory import DeviceArray
    # describes device 1 memory (allocates nothing, never dereferenced)
    arr = DeviceArray(4, np.float32, ptr=4096, device=1)
    pk = packer_for(r'extern "C" __global__ void k(const float* x) {}', "k")   # runs on device 0
    with pytest.raises(ArgumentError, match="on device 1 but this launch runs on device 0"):
        pk.convert_all((arr,), [])
    for pack in _packers():   # nor the packing step of a launch, in C or Python
        with pytest.raises(ArgumentError, match="device 1"):
            pk.filler(ctypes.create_string_buffer(pk.size), pack)((arr,), [])


def test_pointer_to_pointer_takes_arrays_of_addresses():
    assert parse_type("float**").typestr is None
    assert parse_type("const float* const*").typestr is None
    assert parse_type("const float*").typestr == np.dtype(np.float32).str


def test_unnamed_parameters_keep_multi_word_types():
    sig = parse_signatures('extern "C" __global__ void k(float*, unsigned char, unsigned short, '
                           'signed char, int);')["k"]
    assert [p.ctype.size for p in sig.params] == [8, 1, 2, 1, 4]


def test_nested_fields_are_checked_like_parameters():
    src = ("struct P { float3 pos; int id; };\n"
           'extern "C" __global__ void k(P p) {}')
    pk = packer_for(src, "k")
    raw = pk.convert_all(({"pos": (1.0, 2.0, 3.0), "id": 7},), [])[0]
    assert struct.unpack_from("<3fi", raw) == (1.0, 2.0, 3.0, 7)
    with pytest.raises(ArgumentError, match="3 components, got 2"):
        pk.convert_all(({"pos": (1.0, 2.0), "id": 7},), [])
    with pytest.raises(ArgumentError, match="integer"):
        pk.convert_all(({"pos": (1.0, 2.0, 3.0), "id": 2.7},), [])
    with pytest.raises(ArgumentError, match="overflows"):
        pk.convert_all(({"pos": (1e39, 2.0, 3.0), "id": 1},), [])
    with pytest.raises(ArgumentError, match="missing"):
        pk.convert_all(({"pos": {"x": 1.0, "y": 2.0}, "id": 1},), [])


def test_huge_int_for_a_float_parameter_is_an_argument_error():
    pk = packer_for(r'extern "C" __global__ void k(float a, __half h) {}', "k")
    with pytest.raises(ArgumentError, match="overflows"):
        pk.convert_all((2**200, 1.0), [])
    with pytest.raises(ArgumentError, match="overflows"):
        pk.convert_all((1.0, 70000), [])


@pytest.mark.parametrize("value, why", [
    ({"a": 1.0}, r"missing \['b'\]"), ((1.0,), "expected 2 fields"), ({"a": 1.0, "b": 2.5}, "is an integer"),
    ("x", "got str"), ({"a": 1.0, "b": 2**40}, "does not fit"), ({"a": "x", "b": 1}, "could not convert"),
])
def test_struct_argument_errors_name_the_parameter_once(value, why):
    pk = packer_for('struct S { float a; int b; };\nextern "C" __global__ void k(S s) {}', "k")
    with pytest.raises(ArgumentError, match=why) as err:
        pk.convert_all((value,), [])
    assert str(err.value).count("parameter 0 's' (struct S)") == 1, str(err.value)


class HugeCAI:
    """A foreign array whose interface gives an address no pointer can hold."""

    __cuda_array_interface__ = {"data": (2**64, False), "typestr": "<f4", "shape": (4,),
                                "version": 3}


@pytest.mark.parametrize("pack", _packers(), ids=lambda p: "c packer" if p else "python")
@pytest.mark.parametrize("value", [ptr(2**64), HugeCAI()], ids=["ptr", "cai"])
def test_a_value_struct_refuses_is_an_argument_error_naming_the_parameter(pack, value):
    # the converters let these through (a ptr has no upper bound, an interface's address is
    # taken as given); struct refuses them, and the error still names the parameter
    pk = packer_for(r'extern "C" __global__ void k(int n, float* out) {}', "k")
    buf, _arr, _addr = pk.new_buffers()
    fill = pk.filler(buf, pack)
    for step in (lambda pending: fill((3, value), pending),
                 lambda pending: pk.careful(buf, (3, value), pending)):
        pending = ["stale"]
        with pytest.raises(ArgumentError, match=r"parameter 1 'out' \(float\*\).*does not fit"):
            step(pending)
        assert pending == []


def test_an_unknown_type_given_an_address_too_big_names_the_parameter():
    pk = Packer("k", layout([None], ["arg0"], [(0, 8)]), 0)
    with pytest.raises(ArgumentError, match=r"parameter 0 'arg0'.*does not fit"):
        pk.careful(bytearray(8), (ptr(2**64),), [])


@pytest.mark.parametrize("pack", _packers(), ids=lambda p: "c packer" if p else "python")
def test_a_refused_argument_drops_the_copies_already_made(pack, monkeypatch):
    # an In copy is made, then a later argument is refused: nothing runs, so no copy is kept
    # (an Out would otherwise be copied back after some later launch)
    from kjit import In
    from kjit.runtime.memory import DeviceArray, _HostTransfer
    made = []
    monkeypatch.setattr(_HostTransfer, "to_device", lambda self: made.append(self) or
                        DeviceArray(4, np.float32, ptr=0x7000, device=0))
    src = 'struct S { float a; int b; };\nextern "C" __global__ void k(void* p, S s, int n) {}'
    pk = packer_for(src, "k")
    buf, _arr, _addr = pk.new_buffers()
    fill = pk.filler(buf, pack)
    for bad, why in [(((1.0, 2), 2**40), r"parameter 2 'n'"), (((1.0, 2.5), 1), "is an integer")]:
        pending = []
        with pytest.raises(ArgumentError, match=why):
            fill((In(np.ones(4, np.float32)), *bad), pending)
        assert made and pending == []
    pending = []
    fill((In(np.ones(4, np.float32)), (1.0, 2), 3), pending)
    assert len(pending) == 1 and struct.unpack_from("<Q", buf, 0)[0] == 0x7000


def test_bfloat16_and_float8_pointers_take_their_type_or_its_bits():
    """numpy has no bfloat16 or float8: a kernel's pointer to one takes arrays of that type
    (PyTorch's) or of unsigned ints of its size holding its bits, in C as in Python, and
    refuses any other element type, naming the parameter."""
    from kjit.runtime.libcuda import c_function
    from kjit.runtime.memory import DeviceArray
    assert parse_type("const __nv_bfloat16*").typestr == "bfloat16"
    assert parse_type("__nv_fp8_e5m2*").typestr == "float8_e5m2"
    assert parse_type("__nv_bfloat16**").typestr is None
    pk = packer_for(r'extern "C" __global__ void k(const __nv_bfloat16* x, __nv_fp8_e4m3* y) {}', "k")
    # describe device memory (allocate nothing, never dereferenced)
    bits16, bits8 = (DeviceArray(4, t, ptr=p, device=0) for t, p in ((np.uint16, 4096), (np.uint8, 8192)))
    halves = DeviceArray(4, np.float16, ptr=4096, device=0)
    assert pk.convert_all((bits16, bits8), []) == [4096, 8192]
    for pack in _packers():
        buf = ctypes.create_string_buffer(pk.size)
        pk.filler(buf, pack)((bits16, bits8), [])
        assert struct.unpack("<QQ", buf.raw[:16]) == (4096, 8192)
    pack = c_function("pack")
    if pack is not None:   # written by the C packer itself, not left to Python
        spec, tokens = pk.c_spec()
        buf = ctypes.create_string_buffer(pk.size)
        assert pack(spec, tokens, (bits16, bits8), ctypes.addressof(buf), DeviceArray) == 0
        assert struct.unpack("<QQ", buf.raw[:16]) == (4096, 8192)
        assert pack(spec, tokens, (halves, bits8), ctypes.addressof(buf), DeviceArray) == 1
    with pytest.raises(ArgumentError, match=r"'x'.*holds float16 but the kernel reads bfloat16; "
                                            r"pass a torch\.bfloat16 tensor, or its bits as uint16"):
        pk.convert_all((halves, bits8), [])
    with pytest.raises(ArgumentError, match=r"'y'.*holds int8 but the kernel reads float8_e4m3fn"):
        pk.convert_all((bits16, DeviceArray(4, np.int8, ptr=4096, device=0)), [])


def test_plain_typedefs_type_their_parameters():
    """llm.c's `typedef __nv_bfloat16 floatX;` with kernels taking floatX*: the alias is the
    type it stands for, also in the digest a compiled object keeps of its source."""
    from kjit.compiler.declarations import extract
    from kjit.runtime.memory import DeviceArray
    src = r'''
    typedef __nv_bfloat16 floatX;   // llm.c
    typedef floatX act_t;
    using real = float;
    typedef Packed128<floatX> x128;  // not a plain alias: left alone
    typedef struct { real w; act_t* p; } Pair;
    extern "C" __global__ void k(act_t* out, const floatX* inp, real s, Pair q, x128* v, int n) {}'''
    for text in (src, extract(src)):
        out, inp, s, q, v, n = parse_signatures(text)["k"].params
        assert (out.ctype.typestr, inp.ctype.typestr, inp.ctype.const) == ("bfloat16", "bfloat16", True)
        assert (s.ctype.kind, s.ctype.typestr) == ("float", "<f4")
        assert [f[0] for f in q.ctype.fields] == ["w", "p"] and q.ctype.size == 16
        assert v.ctype.typestr is None and n.ctype.typestr == "<i4"
    pk = packer_for(src.replace("x128* v", "void* v"), "k")
    halves = DeviceArray(4, np.float16, ptr=4096, device=0)
    with pytest.raises(ArgumentError, match=r"'out'.*holds float16 but the kernel reads bfloat16"):
        pk.convert_all((halves, halves, 1.0, (1.0, ptr(0)), ptr(0), 4), [])
