"""Readers (and the fatbin and offload-bundle writers) of the binary formats kjit meets: ELF,
fatbin containers, LZ4, clang offload bundles, .nv.info sections, and sniffing a blob's kind.

Pure byte parsing: these modules import only kjit.errors and kjit.arch (and kjit.families,
where the fatbin writer loads nvFatbin), so everything above (ObjectCode, the compiler, the
linker, the runtime, the CLI) can use them, through the names below (tests/test_faces.py);
each reader loads on first use.
"""
from ..lazy import lazy_names

# Every kind of code kjit handles (ObjectCode.kind). Here, not in sniff: ObjectCode checks a
# kind against it without importing the readers, which a cache hit never needs.
KINDS = ("ptx", "cubin", "ltoir", "fatbin", "hsaco", "hipfb", "object", "library",
         "json")   # json: small records kept in the cache (autotuning timings), never code

__getattr__ = lazy_names(__name__, {
    "ElfFile": "elf", "ElfFormatError": "elf", "check_linkable": "elfcheck",
    "fatbin_entries": "fatbin:entries", "best_entry": "fatbin", "read_fatbin": "fatbin",
    "write_fatbin": "fatbin", "FatbinInput": "fatbin", "FatbinError": "fatbin",
    "FATBIN_COMPRESS_MODES": "fatbin:COMPRESS_MODES",
    "kernel_resources": "nvinfo",
    "sniff_kind": "sniff", "arch_from_bytes": "sniff", "ptx_version": "sniff",
    "PTX_ENTRY_RE": "sniff", "PTX_TARGET_RE": "sniff", "PTX_VERSION_RE": "sniff",
    "read_bundle": "bundle", "write_bundle": "bundle", "BUNDLE_MAGIC": "bundle",
})
