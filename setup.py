"""The one compiled piece of kjit: an optional C launch call (kjit/runtime/_launch.c).
If it cannot be built (no compiler, no Python headers), kjit launches through cuda.bindings."""
from setuptools import Extension, setup

setup(ext_modules=[Extension("kjit.runtime._launch", ["kjit/runtime/_launch.c"],
                             libraries=["dl"], optional=True)])
