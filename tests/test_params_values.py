"""Complex numbers and NumPy records as kernel arguments, on the CPU: the bytes the packer
writes are the device's layout, and a value of the wrong kind is refused naming the parameter.

The cases follow what CuPy users pass: complex scalars and arrays to cuComplex kernels
(cupy/cupy, commit 00f8572fe65269fa6c3e535c9fc71b1f42404de1,
tests/cupy_tests/core_tests/test_raw.py, `_test_cuComplex`: `test_add_scalar`,
`test_addf_scalar`), and structs passed as NumPy records, which CuPy takes by their bytes
(its layout), so a user's record need not name its fields as the struct does.
"""
from __future__ import annotations

import ctypes
import struct

import numpy as np
import pytest

from kjit.errors import ArgumentError
from kjit.runtime.cdecl import parse_signatures
from kjit.runtime.memory import DeviceArray
from kjit.runtime.params import Packer, layout


def packer_for(src: str, name: str = "k") -> Packer:
    sig = parse_signatures(src)[name]
    slots = layout([p.ctype for p in sig.params], [p.name for p in sig.params], None)
    return Packer(name, slots, device=0)


def packed(pk: Packer, *args) -> bytes:
    buf = bytearray(pk.size)
    pk.struct.pack_into(buf, 0, *pk.convert_all(args, []))
    return bytes(buf)


# --- complex numbers ---------------------------------------------------------------------------

@pytest.mark.parametrize("ctype, size, align", [
    ("cuComplex", 8, 8), ("cuFloatComplex", 8, 8), ("cuDoubleComplex", 16, 16),
    ("complex<float>", 8, 8), ("thrust::complex<double>", 16, 16),
    ("cuda::std::complex<float>", 8, 8), ("cuda::std::complex<double>", 16, 16),
])
def test_complex_parameters_lie_where_the_device_puts_them(ctype, size, align):
    pk = packer_for(f'extern "C" __global__ void k(char c, {ctype} z, int n) {{}}')
    c, z, n = pk.slots
    assert (z.offset, z.size, n.offset) == (align, size, align + size)
    fmt = "<2f" if size == 8 else "<2d"
    for value in (1.5 - 2.25j, np.complex64(1.5 - 2.25j), np.complex128(1.5 - 2.25j),
                  np.array(1.5 - 2.25j)):
        raw = packed(pk, 1, value, 7)
        assert struct.unpack_from(fmt, raw, z.offset) == (1.5, -2.25)
        assert struct.unpack_from("<i", raw, n.offset)[0] == 7


@pytest.mark.parametrize("value, why", [
    (1.5, r"expected a complex number .* got float 1\.5; pass complex\(1\.5\)"),
    (2, r"got int 2; pass complex\(2\)"),
    (np.float64(1.0), r"got float64"),
    ("1+2j", r"got str"),
    ((1.0, 2.0), r"got tuple"),
    (1e39 + 0j, r"overflows cuComplex"),
    (np.complex128(0 + 1e39j), r"overflows cuComplex"),
])
def test_a_complex_parameter_refuses_other_values(value, why):
    pk = packer_for('extern "C" __global__ void k(cuComplex z) {}')
    with pytest.raises(ArgumentError, match=why) as err:
        pk.convert_all((value,), [])
    assert "parameter 0 'z' (cuComplex)" in str(err.value)


def test_double_complex_keeps_double_precision():
    pk = packer_for('extern "C" __global__ void k(cuDoubleComplex z) {}')
    z = complex(1 / 3, 1e300)
    assert struct.unpack("<2d", packed(pk, z)) == (z.real, z.imag)


def test_pointers_to_complex_take_arrays_of_that_complex_type():
    pk = packer_for('extern "C" __global__ void k(cuDoubleComplex* a, const cuComplex* b) {}')
    c128 = DeviceArray(4, np.complex128, ptr=4096, device=0)
    c64 = DeviceArray(4, np.complex64, ptr=8192, device=0)
    assert struct.unpack("<QQ", packed(pk, c128, c64)) == (4096, 8192)
    with pytest.raises(ArgumentError, match=r"'a'.*holds complex64 but the kernel reads complex128"):
        pk.convert_all((c64, c64), [])
    with pytest.raises(ArgumentError, match=r"'b'.*holds float32"):
        pk.convert_all((c128, DeviceArray(8, np.float32, ptr=8192, device=0)), [])


# --- records -----------------------------------------------------------------------------------

SUBARRAY = 'struct S { float a; int c[2]; double d; };\nextern "C" __global__ void k(S s) {}'


def test_a_sub_array_field_takes_a_record_s_sub_array():
    pk = packer_for(SUBARRAY)
    dt = np.dtype([("a", "f4"), ("c", "i4", (2,)), ("d", "f8")], align=True)
    rec = np.zeros(1, dt)
    rec[0] = (1.5, (3, -4), 2.5)
    for value in (rec[0], rec, {"a": 1.5, "c": [3, -4], "d": 2.5}, (1.5, (3, -4), 2.5)):
        assert struct.unpack("<fii4xd", packed(pk, value)) == (1.5, 3, -4, 2.5)
    with pytest.raises(ArgumentError, match="field c has 2 elements, got 3"):
        pk.convert_all(({"a": 1.5, "c": [3, 4, 5], "d": 2.5},), [])
    with pytest.raises(ArgumentError, match="is an integer"):
        pk.convert_all(({"a": 1.5, "c": [3, 4.5], "d": 2.5},), [])


def test_a_ctypes_structure_with_an_array_field():
    class Host(ctypes.Structure):
        _fields_ = [("a", ctypes.c_float), ("c", ctypes.c_int * 2), ("d", ctypes.c_double)]
    raw = packed(packer_for(SUBARRAY), Host(1.5, (ctypes.c_int * 2)(3, -4), 2.5))
    assert struct.unpack("<fii4xd", raw) == (1.5, 3, -4, 2.5)


def test_records_match_by_layout_when_names_differ():
    """Other names at the struct's offsets with the struct's sizes: taken by layout."""
    pk = packer_for(SUBARRAY)
    dt = np.dtype({"names": ["x", "y", "z"], "formats": ["<f4", ("<i4", (2,)), "<f8"],
                   "offsets": [0, 4, 16], "itemsize": 24})
    rec = np.array([(1.5, (3, -4), 2.5)], dt)
    assert struct.unpack("<fii4xd", packed(pk, rec[0])) == (1.5, 3, -4, 2.5)
    flat = np.dtype({"names": list("pqrs"), "formats": ["<f4", "<i4", "<i4", "<f8"],
                     "offsets": [0, 4, 8, 16]})   # the sub-array as two fields
    assert struct.unpack("<fii4xd", packed(pk, np.array((1.5, 3, -4, 2.5), flat))) == (1.5, 3, -4, 2.5)


def test_records_match_by_name_when_offsets_differ():
    """A packed record (numpy's default, no padding) named as the struct: its values are
    laid out at the device's offsets."""
    pk = packer_for(SUBARRAY)
    rec = np.array((1.5, (3, -4), 2.5), np.dtype([("a", "f4"), ("c", "i4", (2,)), ("d", "f8")]))
    assert rec.dtype.fields["d"][1] == 12   # the device puts d at 16
    assert struct.unpack("<fii4xd", packed(pk, rec)) == (1.5, 3, -4, 2.5)


@pytest.mark.parametrize("dtype, why", [
    ([("x", "f4"), ("y", "i4", (2,)), ("z", "f8")], "neither by name nor by layout"),  # d at 12
    ({"names": ["x", "y", "z"], "formats": ["<f4", ("<f4", (2,)), "<f8"],
      "offsets": [0, 4, 16]}, "neither by name nor by layout"),     # floats where ints lie
    ({"names": ["x", "y", "z"], "formats": ["<f4", ("<i4", (2,)), ">f8"],
      "offsets": [0, 4, 16]}, "neither by name nor by layout"),     # big-endian
], ids=["packed", "kinds", "byte order"])
def test_records_matching_neither_way_are_refused(dtype, why):
    pk = packer_for(SUBARRAY)
    with pytest.raises(ArgumentError, match=why) as err:
        pk.convert_all((np.zeros((), np.dtype(dtype)),), [])
    assert "parameter 0 's' (struct S)" in str(err.value)
    assert "(a float32 at 0, c ('<i4', (2,)) at 4, d float64 at 16)" in str(err.value)


def test_a_record_array_of_more_than_one_is_refused():
    pk = packer_for(SUBARRAY)
    rec = np.zeros(2, np.dtype([("a", "f4"), ("c", "i4", (2,)), ("d", "f8")], align=True))
    with pytest.raises(ArgumentError, match=r"takes one record, got an array of 2; pass arr\[i\]"):
        pk.convert_all((rec,), [])


@pytest.mark.parametrize("make", [
    lambda: np.array([(1.0, 2.0, 3.0)], [("x", "f8"), ("y", "f8"), ("z", "f8")]),
    lambda: np.array([(1.0, 2.0, 3.0)], [("x", "f8"), ("y", "f8"), ("z", "f8")])[0],
    lambda: np.array([(1.0, 2.0, 3.0)], [("a", "f8"), ("b", "f8"), ("c", "f8")]),
    lambda: np.array([((1.0, 2.0, 3.0),)], [("v", "f8", (3,))])[0],
    lambda: np.array([1.0, 2.0, 3.0]),
    lambda: (1.0, 2.0, 3.0),
], ids=["record array", "structured scalar", "other names", "one sub-array", "array", "tuple"])
def test_a_double3_takes_records_and_sequences(make):
    pk = packer_for('extern "C" __global__ void k(int n, double3 v) {}')
    assert pk.slots[1].offset == 8
    assert struct.unpack_from("<3d", packed(pk, 5, make()), 8) == (1.0, 2.0, 3.0)


def test_complex_fields_in_records():
    pk = packer_for('struct S { char t; cuDoubleComplex z; };\nextern "C" __global__ void k(S s) {}')
    dt = np.dtype([("t", "i1"), ("z", "c16")], align=True)
    assert struct.unpack("<b15x2d", packed(pk, np.array((3, 1 - 2j), dt)))[1:] == (1.0, -2.0)
    assert struct.unpack("<b15x2d", packed(pk, {"t": 3, "z": 1 - 2j}))[1:] == (1.0, -2.0)
    pairs = np.dtype({"names": ["k", "re", "im"], "formats": ["i1", "f8", "f8"],
                      "offsets": [0, 16, 24]})   # the complex as two doubles: by layout
    assert struct.unpack("<b15x2d", packed(pk, np.array((3, 1.0, -2.0), pairs)))[1:] == (1.0, -2.0)
    with pytest.raises(ArgumentError, match="field z is complex"):
        pk.convert_all(({"t": 3, "z": "x"},), [])


def test_a_struct_of_unknown_layout_takes_a_record_of_its_size():
    """A struct kjit cannot lay out (a bit-field) takes the bytes of a record, a structured
    scalar or a one-element record array alike, of the size the driver reports."""
    from kjit.runtime.params import convert
    from kjit.runtime.slots import ParamSlot
    slot = ParamSlot(0, "s", 0, 8, None)
    dt = np.dtype([("bits", "u4"), ("n", "i4")])
    rec = np.array([(5, -1)], dt)
    for value in (rec, rec[0]):
        assert convert(slot, value, 0, []) == rec.tobytes()
    with pytest.raises(ArgumentError, match="does not know this parameter.s C type"):
        convert(slot, np.zeros(2, dt), 0, [])
