"""Cache keys: a sha256 over a canonical JSON description of everything that can change a result."""
from __future__ import annotations

import json
import os
from typing import Any, Mapping

from ..hashing import sha256 as _sha256

# Bump when the entry format or the meaning of a key ingredient changes: old entries then miss.
SCHEMA_VERSION = 1

# Environment variables that can change what a compiler or linker produces, per backend.
# NVRTC 13.5 reads NVRTC_DISABLE_PCH, NVRTC_PCH_HEAP_SIZE, NVRTC_DISABLE_CONCURRENT_NVVM,
# LIBNVVM_DISABLE_CONCURRENT_API and CUDA_CACHE_DISABLE (found in libnvrtc's strings): they
# change speed, not output, so they are not keyed. NVVM_IR_VER_CHK (read by NVRTC and
# nvJitLink) changes which LTO-IR is accepted: keyed. hiprtc appends flags from
# HIPRTC_COMPILE_OPTIONS_APPEND / HIPRTC_LINK_OPTIONS_APPEND and finds device libraries and
# headers through ROCM_PATH / HIP_PATH / HIP_CLANG_PATH / HIP_DEVICE_LIB_PATH: keyed.
KEY_ENV_VARS: dict[str, tuple[str, ...]] = {
    "cuda": ("NVVM_IR_VER_CHK",),
    "nvjitlink": ("NVVM_IR_VER_CHK",),
    "hip": ("HIPRTC_COMPILE_OPTIONS_APPEND", "HIPRTC_LINK_OPTIONS_APPEND", "HIP_PATH",
            "HIP_CLANG_PATH", "HIP_DEVICE_LIB_PATH", "HIP_PLATFORM", "ROCM_PATH"),
}


def canonical(obj: Any) -> bytes:
    """One byte string per meaning: sorted keys, no whitespace, no NaN."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode()


def key_hash(namespace: str, key: Mapping[str, Any]) -> str:
    """The cache key (sha256 hex) for `key` in `namespace` under this schema version."""
    try:
        text = canonical({"schema": SCHEMA_VERSION, "namespace": namespace, "key": key})
    except (TypeError, ValueError) as exc:
        from ..errors import InvalidOptionError
        raise InvalidOptionError(f"cache key for {namespace!r} is not plain JSON data: {exc}") from None
    return _sha256(text).hexdigest()


def sha256(data: bytes | str) -> str:
    if isinstance(data, str):
        data = data.encode()
    return _sha256(data).hexdigest()


def env_fingerprint(backend: str) -> dict[str, str]:
    """The environment variables that can change `backend`'s output and are set."""
    env = os.environ
    return {name: env[name] for name in KEY_ENV_VARS.get(backend, ()) if name in env}


def digest(obj: Any) -> str:
    """sha256 hex over an ObjectCode's kind, arch and code: identifies a link input by content."""
    import hashlib  # any size, many times: OpenSSL's
    h = hashlib.sha256()
    h.update(f"{obj.kind}\0{obj.arch or ''}\0".encode())
    h.update(obj.code)
    return h.hexdigest()
