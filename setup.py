"""The one compiled piece of kjit: an optional C launch extension (kjit/runtime/_launch.c, with
the k[config] tables in _tables.c and the framework-array packer in _foreign.c).
If it cannot be built (no compiler, no Python headers), kjit launches through cuda.bindings."""
from setuptools import Extension, setup

setup(ext_modules=[Extension("kjit.runtime._launch",
                             ["kjit/runtime/_launch.c", "kjit/runtime/_foreign.c", "kjit/runtime/_tables.c"],
                             depends=["kjit/runtime/_launch.h"],
                             libraries=["dl"], optional=True)])
