"""The compile key: what makes one, and how it is found again without compiling.

A compile's key is sha256 over canonical JSON (kjit.cache.key_hash) of:

  schema, namespace   the cache's SCHEMA_VERSION and "compile"
  source_sha256, name the source's digest, and its name (anchors "quoted" includes)
  arch, target        "sm_90a" / "gfx90a"; "cubin", "ptx", "ltoir", "hsaco"
  backend             "cuda" (NVRTC) or "hip" (hiprtc)
  options             CompileOptions.describe(): normalised, the nvcc prelude by its digest
  name_expressions    as given, in order
  compiler            identity.compiler_identity: API version and the wheel's full version
  env                 the KEY_ENV_VARS set (NVVM_IR_VER_CHK; hiprtc: HIPRTC_*, HIP_*, ROCM_PATH)
  sources_dir         with line or debug information only: where the sources are kept
  memory              the in-memory headers' digests, by name
  read                every file the compiler read, by name (below a known root, the
                      root-relative one: roots.py) and sha256; through a precompiled
                      header, the files it was built from (the key a compile without it gets)
  probed              every file it found and did not read, by name
  env_read            the environment variables it was seen to read that are set, with values

read, probed and env_read come from observing the compile (observe.py, the C extension
_observe.c). Not in the key but checked before a remembered key is used (snapshot.py): each
file's stat data, every path it looked for and did not find with the nearest directory that
decided it, the variables it read unset, and the working directory where it looked there.
A compile that cannot be observed is keyed by the request alone (no memory, read, probed or
env_read), and only when it cannot read a header (includes.header_dependent).

description.py  the key's description, worked out once per request (Described, Observed)
derive.py       a request's key: manifest, another install's record, or its compile observed
observe.py      what the compiler read, recorded from its own libc calls (+ _observe*.c)
snapshot.py     the files a key was derived from, and the cheap check that they still hold
manifest.py     keys remembered across processes, filed by everything known before compiling
portable.py     records of what a compile read under install-independent names, for other
                installs and nodes, and the cluster's lease on one not yet filed
watch.py        change notification, so an in-process repeat stats nothing
roots.py        install-independent names of headers under the toolkit's and kjit's roots
includes.py     the include scan: compile_key of a source that does not compile, and whether
                a compile that cannot be observed may read a header
identity.py     the compiler's identity
"""
