"""kjit's optional C extensions. The launcher (kjit/runtime/_launch.c, with libcuda's functions
in _libcuda.c, the k[config] tables in _tables.c and the framework-array packer in _foreign.c): without it kjit launches
through cuda.bindings. The compile observer (kjit/compiler/keys/_observe.c): without it a
compile that may read a header is not cached (docs/headers.md). The PCH heap pin
(kjit/compiler/_pchheap.c): without it precompiled headers serve only the process that made
them (docs/headers.md). The XLA FFI handler
(kjit/runtime/_xla.c): without it `as_jax_op` is unavailable (docs/jax.md)."""
from setuptools import Extension, setup

setup(ext_modules=[Extension("kjit.runtime._launch",
                             ["kjit/runtime/_launch.c", "kjit/runtime/_args.c", "kjit/runtime/_libcuda.c", "kjit/runtime/_foreign.c",
                              "kjit/runtime/_tables.c", "kjit/runtime/_gil.c"],
                             depends=["kjit/runtime/_args.h", "kjit/runtime/_foreign.h", "kjit/runtime/_tables.h", "kjit/runtime/_gil.h",
                                      "kjit/runtime/_libcuda.h", "kjit/runtime/_pyint.h", "kjit/runtime/_path.h"],
                             libraries=["dl"], optional=True),
                   Extension("kjit.runtime._xla", ["kjit/runtime/_xla.c"], libraries=["dl"],
                             optional=True),
                   Extension("kjit.compiler.keys._observe",
                             ["kjit/compiler/keys/_observe.c", "kjit/compiler/keys/_observe_got.c"],
                             depends=["kjit/compiler/keys/_observe.h"], libraries=["dl"], optional=True),
                   Extension("kjit.compiler._pchheap", ["kjit/compiler/_pchheap.c"], optional=True)])
