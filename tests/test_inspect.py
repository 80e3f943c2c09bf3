"""`kjit inspect`: fatbins, cubins, PTX, LTO-IR and HIP bundles, as text and JSON."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from kjit.cli.main import cli
from kjit.compiler.cached import compile as kjit_compile
from kjit.build.pack import make_fatbin

SRC = r'''
extern "C" __global__ void __launch_bounds__(256) reduce(const float* x, float* out) {
    __shared__ float t[256];
    t[threadIdx.x] = x[blockIdx.x * 256 + threadIdx.x];
    __syncthreads();
    if (threadIdx.x == 0) { float s = 0; for (int k = 0; k < 256; ++k) s += t[k]; out[blockIdx.x] = s; }
}
extern "C" __global__ void fill(int* p, int v) { p[threadIdx.x] = v; }
'''

FILE_KEYS = {"file", "kind", "size", "arch", "symbols", "kernels", "entries"}
ENTRY_KEYS = {"kind", "arch", "size", "stored_size", "name", "compressed", "compression",
              "decoded", "ptx_version", "options", "kernels"}
RESOURCE_KEYS = {"name", "arch", "registers", "shared_bytes", "shared_section_bytes",
                 "local_bytes", "stack_bytes", "const_bytes", "param_bytes", "max_threads",
                 "max_threads_dims", "reqntid", "max_registers", "barriers", "params"}


def inspect_json(*paths):
    r = CliRunner().invoke(cli, ["inspect", "--json", *map(str, paths)])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def check_schema(d, kind):
    assert set(d) == FILE_KEYS and d["kind"] == kind
    assert isinstance(d["entries"], list) and d["entries"]
    for e in d["entries"]:
        assert ENTRY_KEYS <= set(e)
        assert isinstance(e["size"], int) and isinstance(e["kernels"], list)
        for k in e["kernels"]:
            assert "name" in k
            if e["kind"] == "cubin":
                assert set(k) == RESOURCE_KEYS
                assert all(isinstance(k[f], int) for f in
                           ("registers", "shared_bytes", "local_bytes", "stack_bytes"))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("inspect")
    cubin = kjit_compile(SRC, arch="sm_90", name="r.cu", cache=False)
    ptx = kjit_compile(SRC, arch="compute_80", target="ptx", name="r.cu", cache=False)
    ltoir = kjit_compile(SRC, arch="sm_90", target="ltoir", name="r.cu", cache=False)
    sm80 = kjit_compile(SRC, arch="sm_80", name="r.cu", cache=False)
    out = {"cubin": d / "r.cubin", "ptx": d / "r.ptx", "ltoir": d / "r.ltoir", "fatbin": d / "r.fatbin"}
    cubin.save(out["cubin"])
    ptx.save(out["ptx"])
    ltoir.save(out["ltoir"])
    make_fatbin([sm80, cubin, ptx]).save(out["fatbin"])
    return out


def test_fatbin(files):
    d = inspect_json(files["fatbin"])
    check_schema(d, "fatbin")
    assert [(e["kind"], e["arch"]) for e in d["entries"]] == [
        ("cubin", "sm_80"), ("cubin", "sm_90"), ("ptx", "compute_80")]
    assert set(d["kernels"]) == {"reduce", "fill"}
    sm90 = {k["name"]: k for k in d["entries"][1]["kernels"]}
    assert sm90["reduce"]["shared_bytes"] == 1024 and sm90["reduce"]["max_threads"] == 256
    assert sm90["fill"]["shared_bytes"] == 0 and sm90["fill"]["max_threads"] is None
    assert d["entries"][2]["ptx_version"] and d["entries"][2]["ptx_target"] == "sm_80"


def test_cubin(files):
    d = inspect_json(files["cubin"])
    check_schema(d, "cubin")
    assert d["arch"] == "sm_90" and len(d["entries"]) == 1
    assert {k["name"] for k in d["entries"][0]["kernels"]} == {"reduce", "fill"}


def test_ptx(files):
    d = inspect_json(files["ptx"])
    check_schema(d, "ptx")
    [e] = d["entries"]
    assert e["arch"] == "compute_80" and e["ptx_target"] == "sm_80"
    assert e["ptx_version"] == ".".join(map(str, kjit_compile(
        SRC, arch="compute_80", target="ptx", cache=False).ptx_version))
    assert [k["name"] for k in e["kernels"]] == ["reduce", "fill"]


def test_ltoir(files):
    d = inspect_json(files["ltoir"])
    check_schema(d, "ltoir")
    assert d["entries"][0]["arch"] == "sm_90"   # from the sidecar kjit compile writes
    assert d["entries"][0]["kernels"] == []     # known only after linking


def test_several_files_give_a_list(files):
    data = inspect_json(files["cubin"], files["ptx"])
    assert [d["kind"] for d in data] == ["cubin", "ptx"]


def test_text_output_has_the_resource_table(files):
    r = CliRunner().invoke(cli, ["inspect", str(files["fatbin"])])
    assert r.exit_code == 0, r.output
    assert "3 entries" in r.output and "regs" in r.output and "shared" in r.output
    assert "reduce" in r.output and "compute_80" in r.output and "PTX ISA" in r.output


def test_symbols_from_the_sidecar(tmp_path):
    tmpl = "template <typename T> __global__ void k(T* p) { p[0] = T(1); }"
    objs = [kjit_compile(tmpl, arch=a, name_expressions=["k<int>"], cache=False)
            for a in ("sm_80", "sm_90")]
    make_fatbin(objs).save(tmp_path / "t.fatbin")
    d = inspect_json(tmp_path / "t.fatbin")
    assert d["symbols"] == {"k<int>": "_Z1kIiEvPT_"}
    assert d["kernels"] == ["_Z1kIiEvPT_"]


def test_a_corrupt_file_is_a_clear_error(files, tmp_path):
    cut = tmp_path / "cut.fatbin"
    cut.write_bytes(files["fatbin"].read_bytes()[:200])
    r = CliRunner().invoke(cli, ["inspect", str(cut)])
    assert r.exit_code == 1 and "truncated" in r.output and "Traceback" not in r.output
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"hello world, not a kernel")
    r = CliRunner().invoke(cli, ["inspect", str(junk)])
    assert r.exit_code == 1 and "unrecognised" in r.output


def _hiprtc_available() -> bool:
    try:
        from kjit.compiler import hiprtc
        hiprtc.version()
        return True
    except Exception:
        return False


@pytest.mark.skipif(not _hiprtc_available(), reason="hiprtc (libamdhip64) is not installed")
def test_hipfb(tmp_path):
    from kjit.formats.bundle import write_bundle
    from kjit.objectcode import ObjectCode
    src = 'extern "C" __global__ void fill(int* p, int v) { p[threadIdx.x] = v; }\n'
    objs = [kjit_compile(src, arch=a, backend="hip", cache=False) for a in ("gfx908", "gfx90a")]
    ObjectCode(write_bundle([(o.arch, o.code) for o in objs]), kind="hipfb").save(tmp_path / "k.hipfb")
    d = inspect_json(tmp_path / "k.hipfb")
    check_schema(d, "hipfb")
    hsaco = [e for e in d["entries"] if e["kind"] == "hsaco"]
    assert sorted(e["arch"] for e in hsaco) == ["gfx908", "gfx90a"]
    assert all(e["kernels"] == [{"name": "fill"}] for e in hsaco)


# --- `kjit build`, `kjit compile` and `kjit inspect` say the same about one file ---------------------
def _cli_json(*args):
    r = CliRunner().invoke(cli, [*map(str, args), "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


@pytest.mark.parametrize("compress", ["none", "speed"])
def test_build_reports_each_entry_as_inspect_reads_it(tmp_path, compress):
    """nvFatbin strips PTX comments and whitespace: build reported the compiler's 1035 B,
    inspect the 822 B stored. Both now give the sizes the file holds."""
    src = tmp_path / "k.cu"
    src.write_text("// a comment nvFatbin drops\n" + SRC)
    out = tmp_path / "k.fatbin"
    built = _cli_json("build", src, "--arch", "sm_90", "--arch", "sm_80", "--ptx", "compute_80",
                      "--compress", compress, "-o", out, "--no-cache")
    seen = inspect_json(out)
    assert built["size"] == seen["size"] and len(built["entries"]) == len(seen["entries"]) == 3
    assert sorted((e["kind"], e["arch"], e["size"], e["stored_size"]) for e in built["entries"]) == \
        sorted((e["kind"], e["arch"], e["size"], e["stored_size"]) for e in seen["entries"])


def test_ptx_is_labelled_with_its_virtual_arch_everywhere(tmp_path):
    """`kjit compile --emit ptx --arch sm_90` said sm_90, build and inspect compute_90."""
    src = tmp_path / "k.cu"
    src.write_text(SRC)
    out = tmp_path / "k.ptx"
    compiled = _cli_json("compile", src, "--arch", "sm_90", "--emit", "ptx", "-o", out)
    assert compiled["arch"] == "compute_90"
    assert inspect_json(out)["arch"] == inspect_json(out)["entries"][0]["arch"] == "compute_90"
    assert kjit_compile(SRC, arch="sm_90a", target="ptx", cache=False).arch == "compute_90a"


@pytest.mark.skipif(not _hiprtc_available(), reason="hiprtc (libamdhip64) is not installed")
def test_build_and_inspect_count_the_same_bundle_entries(tmp_path):
    """A HIP bundle of two code objects: build said 2 entries, inspect 3 (it counted the
    empty host entry every bundle carries). Both count the code objects."""
    src = tmp_path / "k.hip"
    src.write_text('extern "C" __global__ void fill(int* p, int v) { p[threadIdx.x] = v; }\n')
    out = tmp_path / "k.hipfb"
    built = _cli_json("build", src, "--backend", "hip", "--arch", "gfx908,gfx90a", "-o", out, "--no-cache")
    seen = inspect_json(out)
    assert len(built["entries"]) == len(seen["entries"]) == 2
    assert sorted((e["arch"], e["size"]) for e in built["entries"]) == \
        sorted((e["arch"], e["size"]) for e in seen["entries"])
    r = CliRunner().invoke(cli, ["inspect", str(out)])
    assert ", 2 entries" in r.output.splitlines()[0]
