"""Readers (and the fatbin and offload-bundle writers) of the binary formats kjit meets: ELF,
fatbin containers, LZ4, clang offload bundles, .nv.info sections, and sniffing a blob's kind.

Pure byte parsing: these modules import only kjit.errors and kjit.arch (and kjit.families,
where the fatbin writer loads nvFatbin), so everything above (ObjectCode, the compiler, the
linker, the runtime, the CLI) can use them.
"""

# Every kind of code kjit handles (ObjectCode.kind). Here, not in sniff: ObjectCode checks a
# kind against it without importing the readers, which a cache hit never needs.
KINDS = ("ptx", "cubin", "ltoir", "fatbin", "hsaco", "hipfb", "object", "library",
         "json")   # json: small records kept in the cache (autotuning timings), never code
