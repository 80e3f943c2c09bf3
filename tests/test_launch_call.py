"""The compiled launch call (kjit/runtime/_launch.c) and its fallback to cuda.bindings."""
import ctypes

import pytest

from kjit.errors import ArgumentError

from kjit import driver
from kjit.runtime.kernel import c_launch


def test_fallback_when_asked(monkeypatch):
    monkeypatch.setenv("KJIT_LAUNCH", "bindings")
    assert c_launch() is None


def test_without_a_driver_kjit_falls_back_and_the_extension_says_why():
    if driver.available():
        pytest.skip("a CUDA driver is present: the GPU tests launch through the C call")
    assert c_launch() is None
    _launch = pytest.importorskip("kjit.runtime._launch", reason="C launch call not built here")
    with pytest.raises(OSError, match="libcuda"):
        _launch.bind()
    with pytest.raises(RuntimeError, match="bind"):
        _launch.launch(*([0] * 10))


@pytest.mark.gpu
def test_gpu_kernels_launch_through_the_c_call_when_built():
    import numpy as np

    import kjit
    pytest.importorskip("kjit.runtime._launch", reason="C launch call not built here")
    k = kjit.load(kjit.compile('extern "C" __global__ void f(int* p) { p[threadIdx.x] = threadIdx.x; }')
                  ).get_function("f")
    assert k.c_launch is not None
    out = kjit.zeros(32, np.int32)
    launcher = k[1, 32]
    assert type(getattr(launcher, "__self__", None)).__name__ == "Launcher"   # pack and launch in one C call
    launcher(out)
    assert out.get().tolist() == list(range(32))
    # what the C call declines goes to the Python launcher, errors and all
    with pytest.raises(kjit.ArgumentError, match="takes 1 arguments"):
        launcher(out, 1)
    with pytest.raises(kjit.ArgumentError, match="int32"):
        launcher(kjit.zeros(32, np.float32))
    with pytest.raises(TypeError):
        launcher(p=out)


def _launcher(fallback, nargs=1):
    _launch = pytest.importorskip("kjit.runtime._launch", reason="C launch call not built here")
    import struct

    from kjit.runtime.memory import DeviceArray
    spec = b"".join(struct.pack("<ii", 5, 4 * i) for i in range(nargs))   # int32 parameters
    return _launch.launcher(fallback, lambda err, stream: None, spec, (None,) * nargs, DeviceArray,
                            [None], "k", 0, 0, 1, 1, 1, 32, 1, 1, 0, 0, ctypes.c_uint64(0), 0, 0, 0)


def test_launcher_hands_what_it_cannot_launch_to_the_python_launcher():
    # with no driver bound (or on another thread) every call goes to the Python launcher,
    # with the same arguments, keywords included
    if driver.available():
        pytest.skip("a CUDA driver is present: the GPU test covers the C path")
    calls = []
    launcher = _launcher(lambda *a, **kw: calls.append((a, kw)))
    launcher(7)
    launcher(1, 2, x=3)
    assert calls == [((7,), {}), ((1, 2), {"x": 3})]


def test_launcher_is_collected_with_its_kernel():
    # kernel -> its launchers -> Python launcher -> kernel is a cycle through a C object:
    # the garbage collector must see into it, or every kernel would leak
    import gc
    import weakref

    class Owner:
        pass

    owner = Owner()
    owner.launcher = _launcher(lambda *a: owner)
    dead = weakref.ref(owner)
    del owner
    gc.collect()
    assert dead() is None


MIXED = (r'extern "C" __global__ void k(char a, unsigned char b, short c, unsigned short d, int e, '
         r'unsigned f, long long g, size_t h, float i, double j, const float* x, double* y) {}')


def _packers():
    import numpy as np

    from kjit.runtime.cdecl import parse_signatures
    from kjit.runtime.params import Packer, layout
    _launch = pytest.importorskip("kjit.runtime._launch", reason="C launch call not built here")
    sig = parse_signatures(MIXED)["k"]
    pk = Packer("k", layout([p.ctype for p in sig.params], [p.name for p in sig.params], None), 0)
    return _launch.pack, pk, np


def _array(np, dtype, ptr):
    from kjit.runtime.memory import DeviceArray
    # describes device memory at `ptr` (allocates nothing, never dereferenced)
    return DeviceArray(4, dtype, ptr=ptr, device=0)


def test_c_packer_writes_the_same_bytes_as_the_python_packer():
    import ctypes
    import random
    pack, pk, np = _packers()
    spec, tokens = pk.c_spec()
    from kjit.runtime.memory import DeviceArray
    rnd = random.Random()

    def integer(lo, hi):   # half of them at the edges: of the range, and of one-digit ints (2**30)
        edges = [v for v in (lo, hi, 0, 1, -1, 2**30 - 1, 2**30, -2**30, -2**30 - 1) if lo <= v <= hi]
        return rnd.choice(edges) if rnd.random() < 0.5 else rnd.randint(lo, hi)
    # arrays made once and passed again (their addresses read from a remembered int), up to 2**64
    pool = [(_array(np, np.float32, rnd.randint(1, 2**64 - 1)), _array(np, np.float64, rnd.randint(1, 2**48)))
            for _ in range(3)]
    for _ in range(400):
        f32, f64 = rnd.choice(pool) if rnd.random() < 0.5 else \
            (_array(np, np.float32, rnd.randint(1, 2**64 - 1)), _array(np, np.float64, rnd.randint(1, 2**48)))
        args = (integer(-128, 127), integer(0, 255), integer(-2**15, 2**15 - 1),
                integer(0, 2**16 - 1), integer(-2**31, 2**31 - 1), integer(0, 2**32 - 1),
                integer(-2**63, 2**63 - 1), integer(0, 2**64 - 1), rnd.uniform(-1e30, 1e30),
                rnd.uniform(-1e300, 1e300), f32, f64)
        c_buf = ctypes.create_string_buffer(pk.size)
        assert pack(spec, tokens, args, ctypes.addressof(c_buf), DeviceArray) == 0
        py_buf = ctypes.create_string_buffer(pk.size)
        pk.struct.pack_into(py_buf, 0, *pk.convert_all(args, []))
        assert c_buf.raw == py_buf.raw


@pytest.mark.parametrize("index, value", [
    (0, 128), (1, -1), (4, 2**31), (5, -1), (7, 2**64), (4, True), (4, 1.0), (8, 1e39),
    (8, 1), (10, "x"),
])
def test_c_packer_leaves_anything_unusual_to_python(index, value):
    import ctypes
    pack, pk, np = _packers()
    from kjit.runtime.memory import DeviceArray
    spec, tokens = pk.c_spec()
    valid = [1, 1, 1, 1, 1, 1, 1, 1, 1.0, 1.0, _array(np, np.float32, 64), _array(np, np.float64, 64)]
    args = list(valid)
    args[index] = value
    buf = ctypes.create_string_buffer(pk.size)
    assert pack(spec, tokens, tuple(args), ctypes.addressof(buf), DeviceArray) == index + 1
    args = list(valid)
    args[10] = _array(np, np.float64, 64)   # an array of the wrong dtype: Python says so
    assert pack(spec, tokens, tuple(args), ctypes.addressof(buf), DeviceArray) == 11
    assert pack(spec, tokens, tuple(valid), ctypes.addressof(buf), DeviceArray) == 0
    assert pack(spec, tokens, tuple(args[:3]), ctypes.addressof(buf), DeviceArray) == -1


def test_kernels_with_structs_pack_numbers_in_c_and_structs_in_python():
    """A struct parameter is converted by Python, the rest by the C packer, into one buffer;
    the C launcher, which would launch with the struct unwritten, refuses such a kernel."""
    import ctypes
    import struct

    from kjit.runtime.cdecl import parse_signatures
    from kjit.runtime.libcuda import c_function
    from kjit.runtime.params import Packer, layout
    pack, make = c_function("pack"), c_function("launcher")
    if pack is None:
        pytest.skip("the C extension (kjit/runtime/_launch.c) is not built")
    sig = parse_signatures('extern "C" __global__ void k(float4 v, int n) {}')["k"]
    pk = Packer("k", layout([p.ctype for p in sig.params], [p.name for p in sig.params], None), 0)
    assert [s.name for s in pk.python_slots] == ["v"]
    for with_c in (pack, None):
        buf = ctypes.create_string_buffer(pk.size)
        pk.filler(buf, with_c)(((1.0, 2.0, 3.0, 4.0), 7), [])
        assert struct.unpack_from("<4fi", buf.raw) == (1.0, 2.0, 3.0, 4.0, 7)
        with pytest.raises(ArgumentError, match=r"parameter 1 'n' \(int\)"):
            pk.filler(buf, with_c)(((1.0, 2.0, 3.0, 4.0), 2**40), [])
        with pytest.raises(ArgumentError, match=r"parameter 0 'v'"):
            pk.filler(buf, with_c)(((1.0, 2.0), 7), [])
    spec, tokens = pk.c_spec()
    with pytest.raises(ValueError, match="every parameter"):
        make(print, print, spec, tokens, type, [None], "k", 0, 0, 1, 1, 1, 32, 1, 1, 0, 0, 0, 0, 0, 0)



def test_a_launcher_refuses_a_spec_its_own_buffer_cannot_hold():
    # each Launcher packs into a buffer of its own, sized from the spec (or the driver's block
    # size): an offset out of alignment or past the block would write outside it
    import struct

    from kjit.runtime.libcuda import c_function
    make = c_function("launcher")
    if make is None:
        pytest.skip("the C extension (kjit/runtime/_launch.c) is not built")

    def launcher(spec, block_size):
        return make(print, print, spec, (None, None), type, [None], "k", 0, 0, 1, 1, 1, 32, 1, 1, 0,
                    0, ctypes.c_uint64(0), 0, 0, block_size)
    ints = struct.pack("<iiii", 5, 0, 5, 4)   # two int32 parameters at 0 and 4
    def made(spec, block_size):   # what the launcher's call is bound to
        return type(launcher(spec, block_size).__self__).__name__
    assert made(ints, 8) == made(ints, 0) == "Launcher"
    with pytest.raises(ValueError, match="smaller than its parameters"):
        launcher(ints, 6)
    with pytest.raises(ValueError, match="out of place"):
        launcher(struct.pack("<iiii", 5, 0, 5, 6), 0)   # an int32 at offset 6
    with pytest.raises(ValueError, match="out of place"):
        launcher(struct.pack("<iiii", 5, 0, 5, -4), 0)
    # kernels may take up to 32764 bytes of parameters (CUDA 12.1, Volta and newer)
    far = struct.pack("<iiii", 5, 0, 5, 32760)
    assert made(far, 32764) == made(far, 0) == "Launcher"
    with pytest.raises(ValueError, match="out of place"):
        launcher(struct.pack("<iiii", 5, 0, 5, 32764), 0)
    with pytest.raises(ValueError, match="at most 32764"):
        launcher(ints, 2**62)

# --- k[config] and f[config] in C (KernelBase / KernelFunctionBase) ------------------------
def _base(name):
    from kjit.runtime.libcuda import c_function
    base = c_function(name)
    if base is None:
        pytest.skip("the C extension (kjit/runtime/_launch.c) is not built")
    return base


def test_kernel_base_serves_configured_launchers_and_configures_a_miss_once():
    class K(_base("KernelBase")):
        def __init__(self):
            self._configs, self.configured = {}, []

        def _configure(self, config):
            self.configured.append(config)
            launcher = ("launcher", config)
            try:
                self._configs[config] = launcher
            except TypeError:
                pass
            return launcher

    k = K()
    assert k[1, 32] == ("launcher", (1, 32))
    assert k[1, 32] is k[1, 32]
    assert k[[2, 1], 32] == ("launcher", ([2, 1], 32))   # a list: no key, configured each time
    k[[2, 1], 32]
    assert k.configured == [(1, 32), ([2, 1], 32), ([2, 1], 32)]



class _Stream:
    """A stream object whose __hash__ is Python, as torch.cuda.Stream's is: it counts calls."""
    hashed = 0

    def __hash__(self):
        _Stream.hashed += 1
        return 7


def test_kernel_base_answers_a_repeated_config_without_hashing_its_stream_again():
    class K(_base("KernelBase")):
        def __init__(self):
            self._configs, self.configured = {}, 0

        def _configure(self, config):
            self.configured += 1
            launcher = self._configs[config] = object()
            return launcher

    k, s = K(), _Stream()
    first = k[1, 32, s]
    _Stream.hashed = 0
    assert all(k[1, 32, s] is first for _ in range(5))
    assert _Stream.hashed <= 1   # the first repeat is looked up; the rest are remembered
    assert k.configured == 1
    other = _Stream()
    assert k[1, 32, other] is not first          # another stream object is another config
    assert k[1, 32, s] is first and k[1, 64, s] is not first
    k._configs = {}                              # a new table: nothing is remembered
    again = k[1, 32, s]
    assert again is not first and k.configured == 4


def test_kernel_base_memo_keeps_to_tuples_hashed_as_tuples():
    import collections

    class Hashed(tuple):   # its own equality: k[config] must ask the table every time
        def __hash__(self):
            _Stream.hashed += 1
            return tuple.__hash__(self)

    class K(_base("KernelBase")):
        def __init__(self):
            self._configs = {}

        def _configure(self, config):
            launcher = self._configs[config] = object()
            return launcher

    k = K()
    config = Hashed((1, 32))
    first = k[config]
    _Stream.hashed = 0
    assert k[config] is first and k[config] is first and _Stream.hashed == 2
    Cfg = collections.namedtuple("Cfg", "grid block")
    named = Cfg(1, 32)
    assert k[named] is k[named] is k[(1, 32)]   # equal to the plain tuple, so the same entry
def test_kernel_base_errors_come_from_configure():
    class K(_base("KernelBase")):
        def __init__(self):
            self._configs = {}

        def _configure(self, config):
            raise ArgumentError(f"bad config {config!r}")

    with pytest.raises(ArgumentError, match="bad config 7"):
        K()[7]


def test_kernel_function_base_without_a_current_context_takes_the_python_path():
    class F(_base("KernelFunctionBase")):
        def __init__(self):
            self._by_current = {0: "never used: no context is current"}

        def _getitem_slow(self, config):
            return ("slow", config)

    assert F()[1, 32] == ("slow", (1, 32))


def test_kernel_bases_are_collected_in_cycles():
    import gc
    import weakref

    class K(_base("KernelBase")):
        def _configure(self, config):
            return None

    k = K()
    k._configs = {"self": k}   # a launcher refers back to its kernel
    ref = weakref.ref(k)
    del k
    gc.collect()
    assert ref() is None


def _run_dev_mode(code):
    """`code` in a fresh interpreter with Python's debug allocator (-X dev): memory freed while
    still in use is overwritten, so a use after free crashes instead of passing by luck."""
    import os
    import subprocess
    import sys
    import textwrap
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, "-X", "dev", "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=120)


def test_kernel_base_lookup_survives_a_config_that_replaces_the_table():
    # the config's __hash__ runs Python in the middle of k[config]; here it replaces the
    # table being searched, dropping its last reference
    _base("KernelBase")
    run = _run_dev_mode("""
        from kjit.runtime.libcuda import c_function

        class K(c_function("KernelBase")):
            def _configure(self, config):
                return "configured"

        class Config:
            def __hash__(self):
                k._configs = {}
                return 1

        k, config = K(), Config()
        for _ in range(3):
            k._configs = {config: object()}
            assert type(k[config]) is object
            assert k[(1, 32)] == "configured"
        print("ok")
    """)
    assert (run.returncode, run.stdout) == (0, "ok\n"), run.stderr


@pytest.mark.gpu
def test_kernel_function_lookup_holds_the_kernel_while_its_config_runs_python():
    # f[config] finds the current context's Kernel in C, then looks the config up in it; the
    # config's __hash__ replaces the table, dropping that Kernel (its last reference) meanwhile
    pytest.importorskip("kjit.runtime._launch", reason="C launch call not built here")
    run = _run_dev_mode("""
        import kjit
        from kjit.runtime.libcuda import c_function, current_context

        @kjit.kernel
        def f():
            return 'extern "C" __global__ void f(int* p) { p[0] = 42; }'

        out = kjit.zeros(1, "int32")
        f[1, 1](out)
        assert out.get()[0] == 42
        ctx = current_context()

        class K(c_function("KernelBase")):
            def _configure(self, config):
                return "configured"

        class Config:
            def __hash__(self):
                f._by_current = {}
                return 1

        for _ in range(3):
            k = K()
            k._configs = {}
            f._by_current = {ctx: k}
            del k
            assert f[Config()] == "configured"
        print("ok")
    """)
    assert (run.returncode, run.stdout) == (0, "ok\n"), run.stderr


def test_the_c_packer_reads_a_learned_foreign_array_type_and_declines_the_rest():
    """The packer's own logic for framework arrays, with a stand-in class that answers like a
    torch.Tensor (data_ptr, is_contiguous, get_device or is_cuda, requires_grad, dtype)."""
    import struct

    from kjit.runtime.libcuda import c_function
    pack, register = c_function("pack"), c_function("register_foreign")
    if pack is None or register is None:
        pytest.skip("the C extension (kjit/runtime/_launch.c) is not built")

    class Tensorish:
        def __init__(self, ptr, dtype="f32-dtype", contiguous=True, device=0, grad=False):
            self.ptr, self.dtype, self.contiguous, self.device = ptr, dtype, contiguous, device
            self.requires_grad = grad

        def data_ptr(self):
            return self.ptr

        def is_contiguous(self):
            return self.contiguous

        def get_device(self):
            return self.device

        @property
        def is_cuda(self):   # asked instead of get_device() where the process has one GPU
            return self.device == 0

    register(Tensorish, 1, "f32-dtype", "<f4")
    spec = struct.pack("<ii", 20, 0)              # one typed pointer at offset 0
    tokens = (("<f4", 0),)
    buf = bytearray(8)
    addr = (ctypes.c_char * 8).from_buffer(buf)
    where = ctypes.addressof(addr)
    class KjitArray:   # stands for kjit.DeviceArray, which takes the other branch
        pass

    assert pack(spec, tokens, (Tensorish(0x7000),), where, KjitArray) == 0
    assert struct.unpack("<Q", bytes(buf))[0] == 0x7000
    for bad in (Tensorish(1, dtype="f64-dtype"), Tensorish(1, contiguous=False),
                Tensorish(1, device=1), Tensorish(1, grad=True), object()):
        assert pack(spec, tokens, (bad,), where, KjitArray) == 1   # the Python path decides


def test_a_dtype_that_numpy_calls_equal_but_of_another_type_is_not_taken_for_it():
    """numpy's dtype equals whatever it would convert from: np.dtype('float64') == None is
    true. A dtype learned as such an object (an array type with no dtype, learned as float32)
    must not answer for an array of another element type: a float64 array read as float32."""
    import struct

    import numpy as np

    from kjit.runtime.libcuda import c_function
    pack, register = c_function("pack"), c_function("register_foreign")
    if pack is None or register is None:
        pytest.skip("the C extension (kjit/runtime/_launch.c) is not built")

    class Arrayish:   # a learned CuPy-like array type: .dtype, ._c_contiguous, .data
        def __init__(self, ptr, dtype):
            self.dtype, self._c_contiguous = dtype, True
            self.data = type("Memory", (), {"ptr": ptr, "device_id": 0})()

    assert np.dtype("float64") == None   # noqa: E711
    register(Arrayish, 2, None, "<f4")
    buf = ctypes.create_string_buffer(8)
    spec, tokens = struct.pack("<ii", 20, 0), (("<f4", 0),)
    assert pack(spec, tokens, (Arrayish(0x7000, np.dtype("float64")),), ctypes.addressof(buf), type) == 1


def test_the_c_packer_matches_a_dtype_equal_to_the_learned_one():
    """An array whose dtype equals a learned one without being the same object (numpy makes
    such dtypes) is still packed in C, and one of another dtype is still declined."""
    import struct

    from kjit.runtime.libcuda import c_function
    pack, register = c_function("pack"), c_function("register_foreign")
    if pack is None or register is None:
        pytest.skip("the C extension (kjit/runtime/_launch.c) is not built")

    class Dtype:
        def __init__(self, name):
            self.name = name

        def __eq__(self, other):
            return isinstance(other, Dtype) and other.name == self.name

        def __hash__(self):
            return hash(self.name)

    class Arrayish:   # a learned CuPy-like array type: .dtype, ._c_contiguous, .data
        def __init__(self, ptr, dtype):
            self.dtype, self._c_contiguous = dtype, True
            self.data = type("Memory", (), {"ptr": ptr, "device_id": 0})()

    register(Arrayish, 2, Dtype("f4"), "<f4")
    buf = ctypes.create_string_buffer(8)
    spec, tokens = struct.pack("<ii", 20, 0), (("<f4", 0),)
    assert pack(spec, tokens, (Arrayish(0x7000, Dtype("f4")),), ctypes.addressof(buf), type) == 0
    assert struct.unpack("<Q", buf.raw)[0] == 0x7000
    assert pack(spec, tokens, (Arrayish(0x7000, Dtype("f8")),), ctypes.addressof(buf), type) == 1
    # pointers of two types in turn, and one whose address moves: each launch reads it afresh
    class Moving:
        ptr = property(lambda self: self.where)
        device_id = 0
    moving = Moving()
    arrays = [Arrayish(0x7100, Dtype("f4")), Arrayish(0, Dtype("f4"))]
    arrays[1].data = moving
    for where in (0x9000, 0xA000, 0xB000):
        moving.where = where
        for a, expect in zip(arrays, (0x7100, where)):
            assert pack(spec, tokens, (a,), ctypes.addressof(buf), type) == 0
            assert struct.unpack("<Q", buf.raw)[0] == expect


def test_a_frameworks_stream_reader_is_taken_only_as_cupys_by_its_c_signature():
    """The C launcher calls CuPy's stream reader as `intptr_t (int)`: a capsule of any other
    signature, or a reader for PyTorch, is refused before it could be called."""
    from kjit.runtime.libcuda import c_function
    register = c_function("register_stream")
    if register is None:
        pytest.skip("the C extension (kjit/runtime/_launch.c) is not built")
    new = ctypes.pythonapi.PyCapsule_New
    new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    name = b"intptr_t (void)"   # outlives the capsule, which keeps a pointer to it
    wrong = new(1, name, None)
    with pytest.raises(TypeError, match=r"CuPy's, a capsule named \"intptr_t \(int\)\""):
        register(2, lambda device: None, wrong)
    with pytest.raises(TypeError, match="CuPy's"):
        register(1, lambda device: None, object())


def test_cupys_array_layout_is_taken_only_whole_and_in_bounds():
    """The C packer reads CuPy's fields at the offsets it is handed: getters that are not
    getset descriptors, or an offset outside the object, are refused."""
    from kjit.runtime.libcuda import c_function
    register = c_function("register_cupy_layout")
    if register is None:
        pytest.skip("the C extension (kjit/runtime/_launch.c) is not built")
    getter = type.__dict__["__name__"]   # a getset descriptor
    with pytest.raises(TypeError, match="register_cupy_layout"):
        register(getter, getter, object(), int, 96, 80, 104, 24, 32)
    with pytest.raises(TypeError, match="register_cupy_layout"):
        register(getter, getter, getter, int, 96, 80, 104, 4096 * 2, 32)
    with pytest.raises(TypeError, match="register_cupy_layout"):
        register(getter, getter, getter, int, 96, 80, 104, 16, int.__basicsize__)   # past the pointer object


def test_the_current_stream_reader_names_what_it_takes():
    from kjit.runtime.libcuda import c_function
    current = c_function("current_stream")
    if current is None:
        pytest.skip("the C extension (kjit/runtime/_launch.c) is not built")
    for bad in ((3, 0), (2, "0"), (2,)):
        with pytest.raises(TypeError, match=r"current_stream\(kind: 1 \| 2, device: int\)"):
            current(*bad)
