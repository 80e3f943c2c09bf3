"""The HIP side of kjit: offload bundles (bundle.py) and the HIP runtime binding (runtime.py).

Nothing here loads a HIP library at import; the compiler is kjit.compiler.hiprtc. The rest of
kjit imports only from here and from kjit.hip.runtime (tests/test_faces.py).
"""
from ..lazy import lazy_names

__getattr__ = lazy_names(__name__, {
    "load_hip_library": "loader:load_first", "HIPRTC_NAMES": "loader",
    "HIP_RUNTIME_NAMES": "loader:RUNTIME_NAMES", "HIP_INSTALL_HINT": "loader:INSTALL_HINT",
    "comgr_version": "comgr:version", "comgr_isa_names": "comgr:isa_names",
    "comgr_is_valid_target": "comgr:is_valid_target",
})
