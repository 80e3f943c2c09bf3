"""The HIP side of kjit: offload bundles (bundle.py) and the HIP runtime binding (runtime.py).

Nothing here loads a HIP library at import; the compiler is kjit.compiler.hiprtc.
"""
