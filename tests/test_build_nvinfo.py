"""kjit.nvinfo: per-kernel resources from a cubin's ELF sections, checked against ptxas's
own report (-v) and, where installed, `cuobjdump --dump-resource-usage`."""
from __future__ import annotations

import re
import subprocess

import pytest

from kjit.compiler.cached import compile as kjit_compile
from kjit.compiler.options import CompileOptions
from kjit.errors import InvalidOptionError
from kjit.formats.nvinfo import kernel_resources, parse_nvinfo

from test_build_containers import CUOBJDUMP, needs_cuobjdump

SRC = r'''
extern "C" __global__ void tiled(float a, const float* x, float* y, int n) {
    __shared__ float tile[256];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    tile[threadIdx.x] = i < n ? x[i] : 0.0f;
    __syncthreads();
    if (i < n) y[i] = a * tile[threadIdx.x ^ 1] + y[i];
}
extern "C" __global__ void __launch_bounds__(128) bounded(double* p, int n) {
    double loc[40];
    for (int k = 0; k < 40; ++k) loc[k] = p[k * n];
    double s = 0;
    for (int k = 0; k < 40; ++k) s += loc[(k * 7 + n) % 40];
    p[threadIdx.x] = s;
}
extern "C" __global__ void plain(int* p) { p[threadIdx.x] = 1; }
'''
ARCHS = ("sm_80", "sm_90", "sm_100")


@pytest.fixture(scope="module")
def cubins():
    opts = CompileOptions(extra=["--ptxas-options=-v"])
    return {a: kjit_compile(SRC, arch=a, options=opts, cache=False) for a in ARCHS}


def ptxas_report(log: str) -> dict[str, dict[str, int]]:
    """Registers, shared bytes and stack frame per function from ptxas -v output."""
    out: dict[str, dict[str, int]] = {}
    current = None
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            current = out.setdefault(m.group(1), {"smem": 0})
            continue
        if current is None:
            continue
        m = re.search(r"(\d+) bytes stack frame", line)
        if m:
            current["frame"] = int(m.group(1))
        m = re.search(r"Used (\d+) registers", line)
        if m:
            current["regs"] = int(m.group(1))
            s = re.search(r"(\d+) bytes smem", line)
            current["smem"] = int(s.group(1)) if s else 0
    return out


@pytest.mark.parametrize("arch", ARCHS)
def test_resources_match_what_ptxas_reported(cubins, arch):
    obj = cubins[arch]
    report = ptxas_report(obj.log)
    res = {k.name: k for k in kernel_resources(obj.code)}
    assert set(res) == set(report) == {"tiled", "bounded", "plain"}
    for name, r in report.items():
        k = res[name]
        assert k.arch == arch
        assert k.registers == r["regs"], name
        assert k.shared_bytes == r["smem"], name
        assert k.local_bytes == r["frame"], name


@pytest.mark.parametrize("arch", ARCHS)
def test_known_figures_of_the_kernels(cubins, arch):
    res = {k.name: k for k in kernel_resources(cubins[arch].code)}
    assert res["tiled"].shared_bytes == 256 * 4
    assert res["bounded"].max_threads == 128 and res["bounded"].max_threads_dims == (128, 1, 1)
    assert res["tiled"].max_threads is None
    assert res["bounded"].local_bytes >= 40 * 8       # the local array lives in the frame
    assert res["plain"].shared_bytes == 0 and res["plain"].local_bytes == 0
    assert [p.size for p in res["tiled"].params] == [4, 8, 8, 4]
    assert [p.offset for p in res["tiled"].params] == [0, 8, 16, 24]
    assert res["tiled"].param_bytes == 28
    assert res["tiled"].barriers == 1


def test_register_cap_shows_in_the_figures():
    obj = kjit_compile(SRC, arch="sm_90", options=CompileOptions(max_registers=32), cache=False)
    res = {k.name: k for k in kernel_resources(obj.code)}
    for k in res.values():
        assert k.registers is not None and k.registers <= 32
    # the cap applies where __launch_bounds__ does not take precedence
    assert res["tiled"].max_registers == res["plain"].max_registers == 32


def cuobjdump_usage(path) -> dict[str, dict[str, int]]:
    out = subprocess.run([CUOBJDUMP, "--dump-resource-usage", str(path)], capture_output=True,
                         text=True, check=True).stdout
    usage, current = {}, None
    for line in out.splitlines():
        m = re.match(r"\s*Function (\w+):", line)
        if m:
            current = m.group(1)
        elif current and "REG:" in line:
            usage[current] = {k: int(v) for k, v in re.findall(r"([A-Z]+(?:\[0\])?):(\d+)", line)}
            current = None
    return usage


@needs_cuobjdump
@pytest.mark.parametrize("arch", ARCHS)
def test_resources_match_cuobjdump(cubins, arch, tmp_path):
    path = tmp_path / f"k.{arch}.cubin"
    path.write_bytes(cubins[arch].code)
    usage = cuobjdump_usage(path)
    res = {k.name: k for k in kernel_resources(cubins[arch].code)}
    assert set(usage) == set(res)
    for name, u in usage.items():
        k = res[name]
        assert (k.registers, k.stack_bytes, k.shared_section_bytes, k.const_bytes) == (
            u["REG"], u["STACK"], u["SHARED"], u["CONSTANT[0]"]), name


def test_nvinfo_records_and_errors():
    # REGCOUNT (SVAL: symbol 3, 10 registers), MAXREG_COUNT (HVAL 255), NUM_BARRIERS (BVAL 1)
    data = bytes([4, 0x2F, 8, 0, 3, 0, 0, 0, 10, 0, 0, 0, 3, 0x1B, 255, 0, 2, 0x4C, 1, 0])
    recs = parse_nvinfo(data)
    assert [(r.name, r.value) for r in recs][1:] == [("MAXREG_COUNT", 255), ("NUM_BARRIERS", 1)]
    assert recs[0].name == "REGCOUNT" and recs[0].u32s() == (3, 10)
    with pytest.raises(InvalidOptionError, match="truncated"):
        parse_nvinfo(data[:8])
    with pytest.raises(InvalidOptionError, match="not a cubin"):
        kernel_resources(b"not an elf at all" * 5)


def _with_nvinfo(cubin: bytes, content: bytes) -> bytes:
    from crafted import with_section_bytes
    return with_section_bytes(cubin, ".nv.info", content)


@pytest.mark.parametrize("content, message", [
    (bytes([4, 0x2F, 4, 0, 3, 0, 0, 0]), "a REGCOUNT record holds 4 bytes; it needs 8"),   # short REGCOUNT
    (bytes([4, 0x11, 0, 0]), "a FRAME_SIZE record holds 0 bytes"),
    (bytes([1, 0x50, 0, 0, 3, 0x1B]), "MAXREG_COUNT record at offset 4 has a 2-byte value past"),  # cut HVAL
    (bytes([1, 0x50, 0, 0, 2, 0x4C]), "NUM_BARRIERS record at offset 4 has a 1-byte value past"),  # cut BVAL
    (bytes([4, 0x2F, 8, 0, 3, 0]), "REGCOUNT record at offset 0 declares 8 bytes; 2 remain"),
])
def test_malformed_nvinfo_records_are_a_clear_error(cubins, tmp_path, content, message):
    """A short REGCOUNT or a cut-short HVAL/BVAL record exited 70 (ValueError, struct.error,
    IndexError): the reader refuses the section, and `kjit inspect` still lists the kernels
    (from the symbol table) with a note saying what it could not read."""
    import json
    from click.testing import CliRunner
    from kjit.cli.main import cli
    from kjit.formats.nvinfo import NvInfoFormatError
    bad = _with_nvinfo(cubins["sm_90"].code, content)
    with pytest.raises(NvInfoFormatError, match=message):
        kernel_resources(bad)
    f = tmp_path / "bad.cubin"
    f.write_bytes(bad)
    res = CliRunner().invoke(cli, ["inspect", str(f), "--json"])
    assert res.exit_code == 0, res.output
    [entry] = json.loads(res.stdout)["entries"]
    assert entry["kernels"] == [{"name": n} for n in ("bounded", "plain", "tiled")]
    assert entry["note"].startswith("kernel resources unreadable: ") and message in entry["note"]
    text = CliRunner().invoke(cli, ["inspect", str(f)])
    assert text.exit_code == 0 and "kernel resources unreadable" in text.output


def test_device_functions_are_not_kernels():
    """`kjit compile -rdc` listed the device function _Z6helperf as a kernel: entry points
    are the functions marked as CUDA entries, in objects with and without kernels."""
    from kjit.formats.elf import ElfFile
    helper = "__device__ __noinline__ float helper(float x) { return x * 2.0f; }\n"
    kernel = 'extern "C" __global__ void scale(float* y) { y[0] = helper(y[0]); }\n'
    rdc = CompileOptions(relocatable=True)
    only = kjit_compile(helper, arch="sm_90", options=rdc, cache=False)
    both = kjit_compile(helper + kernel, arch="sm_90", options=rdc, cache=False)
    assert "_Z6helperf" in {s.name for s in ElfFile(only.code).symbols}
    assert only.entry_points == () and both.entry_points == ("scale",)
    assert [k.name for k in kernel_resources(both.code)] == ["scale"]
