"""The build engine behind `kjit build`: one fatbin (or HIP offload bundle) for many
architectures, on any machine.

`archs` resolves the targets; `units` makes one compile per (source, architecture) and runs
them through kjit.compile_many: hits from the cache, misses in parallel worker processes;
`engine` links where asked; `pack` packs the cubins (and PTX for forward compatibility) into
one fatbin (nvFatbin, through kjit.formats.fatbin) or the code objects into a bundle.
Lowered names of --name-expression templates go to the `<output>.kjit.json` sidecar, which
ObjectCode.from_file and kjit.load read back.
"""
from __future__ import annotations

from .archs import resolve_archs, resolve_ptx
from .engine import COMPRESS_CHOICES, BuildResult, run_build

__all__ = ["run_build", "BuildResult", "resolve_archs", "resolve_ptx", "COMPRESS_CHOICES"]
