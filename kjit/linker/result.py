"""LinkResult: what kjit.link returns, an ObjectCode that also says how it was linked."""
from __future__ import annotations

from ..objectcode import ObjectCode


class LinkResult(ObjectCode):
    """A linked cubin: an ObjectCode (kind, code, arch, symbols, declarations, save, pickle,
    kjit.load, kjit.link) with what the linker said.

    backend is "driver" or "nvjitlink" and reason says why it was chosen; info_log and
    error_log are the linker's logs; wall_time_ms is the time the linker took for this
    result (kept with the cache entry, so a cache hit reports the original link's time);
    device_runtime is the libcudadevrt.a linked in, if any. They live in `metadata`, so they
    survive save, the cache and pickle like every other field.
    """

    @classmethod
    def from_object(cls, obj: ObjectCode) -> "LinkResult":
        """The LinkResult an ObjectCode made by the linker (a cache entry) describes."""
        return cls.from_checked(obj.code, obj.kind, obj.arch, obj.log, obj.symbols, obj.name,
                                obj.metadata, obj.cache_hit)

    @property
    def object(self) -> ObjectCode:
        """The linked code itself (this result is one)."""
        return self

    @property
    def backend(self) -> str:
        """The linker that made it: "driver" (cuLink*) or "nvjitlink"."""
        return str(self.metadata.get("backend", ""))

    @property
    def reason(self) -> str:
        """Why that linker was chosen."""
        return str(self.metadata.get("reason", ""))

    @property
    def info_log(self) -> str:
        """The linker's information log (the same text as `log`)."""
        return self.log

    @property
    def error_log(self) -> str:
        """The linker's error log (warnings, for a link that succeeded)."""
        return str(self.metadata.get("error_log", ""))

    @property
    def wall_time_ms(self) -> float:
        """How long the link took, in milliseconds (the original link's, on a cache hit)."""
        return float(self.metadata.get("link_ms", 0.0))

    @property
    def device_runtime(self) -> str | None:
        """The path of the libcudadevrt.a linked in, or None."""
        return self.metadata.get("device_runtime")

    def __repr__(self) -> str:
        return (f"LinkResult(kind={self.kind!r}, arch={self.arch!r}, name={self.name!r}, "
                f"backend={self.backend!r}, {len(self.code)} bytes)")
