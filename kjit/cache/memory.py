"""The in-process layer: recently used ObjectCodes by key, bounded in bytes, LRU."""
from __future__ import annotations

from collections import OrderedDict

from .store import DEFAULT_MEMORY, ENV_MEMORY, env_size  # noqa: F401  (re-exported)
from ..objectcode import ObjectCode


class MemoryLayer:
    def __init__(self, limit: int | None = None):
        if limit is None:
            limit = env_size(ENV_MEMORY, DEFAULT_MEMORY)
        self.limit = limit
        self._items: OrderedDict[str, ObjectCode] = OrderedDict()
        self._bytes = 0

    def get(self, key: str) -> ObjectCode | None:
        obj = self._items.get(key)
        if obj is not None:
            self._items.move_to_end(key)
        return obj

    def put(self, key: str, obj: ObjectCode) -> None:
        old = self._items.pop(key, None)
        if old is not None:
            self._bytes -= len(old.code)
        if len(obj.code) > self.limit:
            return
        self._items[key] = obj
        self._bytes += len(obj.code)
        while self._bytes > self.limit:
            _, dropped = self._items.popitem(last=False)
            self._bytes -= len(dropped.code)

    def discard(self, key: str) -> None:
        old = self._items.pop(key, None)
        if old is not None:
            self._bytes -= len(old.code)

    def clear(self) -> None:
        self._items.clear()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._items)
