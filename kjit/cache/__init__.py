"""kjit.cache: compile and link results by exact content hash, on disk and in memory.

Interface for the rest of kjit: get_or_create(namespace, key, create) and digest(obj).
For users: path(), ls(), show(key), stats(), clear(), prune(), verify(), export(file),
import_(file), add_listener(fn). Environment: KJIT_CACHE_DIR (a directory, or a read-only one
and a writable one for new results, os.pathsep-separated), KJIT_CACHE=0, KJIT_CACHE_SIZE
(default 1G, LRU), KJIT_CACHE_MEMORY_SIZE (default 256M), KJIT_CACHE_SAVE_SOURCE=1.
A shared tier for clusters (docs/cluster.md): KJIT_REMOTE_CACHE=redis://host:port/db or
configure_remote(url); ls_remote(), stats_remote(), clear_remote(), push().
"""
from __future__ import annotations

from .disk import CacheWarning
from .entry import CorruptEntry
from .events import CacheEvent, add_listener, remove_listener
from .key import KEY_ENV_VARS, SCHEMA_VERSION, digest, key_hash
from .lookup import enabled_by_env, get_or_create
from ..locations import cache_dir

# The user-facing operations load on first use: a compile's disk hit needs none of them.
_ADMIN = {"clear", "export", "import_", "import_from", "ls", "path", "prune", "show", "stats", "verify",
          "ls_remote", "stats_remote", "clear_remote", "push"}


def __getattr__(name: str):
    if name in _ADMIN:
        from . import admin
        # import_from: a readable alias, kjit.cache.import_from("cluster-cache.zip")
        return getattr(admin, "import_" if name == "import_from" else name)
    if name == "configure_remote":
        from .remote import configure
        return configure
    raise AttributeError(f"module 'kjit.cache' has no attribute {name!r}")

__all__ = ["get_or_create", "digest", "key_hash", "add_listener", "remove_listener", "CacheEvent",
           "CacheWarning", "CorruptEntry", "cache_dir", "path", "ls", "show", "stats", "clear",
           "prune", "verify", "export", "import_", "import_from", "enabled_by_env",
           "KEY_ENV_VARS", "SCHEMA_VERSION", "configure_remote", "ls_remote", "stats_remote",
           "clear_remote", "push"]
