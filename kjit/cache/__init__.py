"""kjit.cache: compile and link results by exact content hash, on disk and in memory.

The rest of kjit imports only from here (tests/test_faces.py): get_or_create(namespace, key,
create), digest(obj), the compile path's hashed lookup and the names below.
For users: path(), ls(), show(key), stats(), clear(), prune(), verify(), export(file),
import_(file), add_listener(fn). Environment: KJIT_CACHE_DIR (a directory, or a read-only one
and a writable one for new results, os.pathsep-separated), KJIT_CACHE=0, KJIT_CACHE_SIZE
(default 1G, LRU), KJIT_CACHE_MEMORY_SIZE (default 256M), KJIT_CACHE_SAVE_SOURCE=1.
A shared tier for clusters (docs/cluster.md): KJIT_REMOTE_CACHE=redis://host:port/db or
configure_remote(url); ls_remote(), stats_remote(), clear_remote(), push().
"""
from __future__ import annotations

from ..lazy import lazy_names
from ..locations import cache_dir
# What every lookup needs, loaded with the face: a compile's disk hit uses these modules.
from .disk import CacheWarning
from .entry import CorruptEntry
from .events import CacheEvent, add_listener, remove_listener
from .key import KEY_ENV_VARS, SCHEMA_VERSION, canonical, digest, env_fingerprint, key_hash
from .key import sha256 as sha256_hex   # of bytes or text, as keys write it
from .lookup import (PendingKey, bypass, creation_lock, current as current_cache, enabled_by_env,
                     get_or_create, lookup_hashed, peek)

# The rest loads on first use: a compile's disk hit needs none of it.
__getattr__ = lazy_names(__name__, {
    # the user-facing operations (kjit cache ...)
    **{n: "admin" for n in ("clear", "clear_report", "export", "ls", "path", "prune", "show",
                            "stats", "verify", "ls_remote", "stats_remote", "clear_remote",
                            "clear_remote_report", "push", "delete", "read_local", "resolve_key",
                            "SORT_FIELDS")},
    "import_": "admin", "import_from": "admin:import_",  # kjit.cache.import_from("cluster.zip")
    "prune_limits": "pruning:limits",
    # the shared tier
    "configure_remote": "remote:configure", "RemoteConfig": "remote", "TierError": "remote",
    "describe_remote": "admin", "REDIS_BACKEND": "registry:REDIS",
    "shared_tier": "lookup",   # read at each call: a tier configured or patched later is seen
    "HeldLease": "shared", "LEASE_RECHECK_S": "shared:RECHECK_S",
    # whose directories may be read, and which one is written
    "trusted": "trust", "read_private": "trust", "Untrusted": "trust",
    "writable": "readonly",
    # precompiled headers kept in the cache directory (kjit.compiler.pch)
    "PCH_SUBDIR": "pchdir:SUBDIR", "pch_stored": "admin",
    "PCH_ORPHAN_S": "pchdir:ORPHAN_S",
    # the kept sources of debuggable kernels
    "SOURCES_SUBDIR": "sources:SUBDIR", "source_file": "sources:file_in",
    "source_holds": "sources:holds", "keep_source": "sources:ensure",
})

__all__ = ["get_or_create", "digest", "key_hash", "add_listener", "remove_listener", "CacheEvent",
           "CacheWarning", "CorruptEntry", "cache_dir", "path", "ls", "show", "stats", "clear",
           "prune", "verify", "export", "import_", "import_from", "enabled_by_env",
           "KEY_ENV_VARS", "SCHEMA_VERSION", "configure_remote", "ls_remote", "stats_remote",
           "clear_remote", "push"]
