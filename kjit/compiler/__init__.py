"""Source to ObjectCode: NVRTC for CUDA, hiprtc for HIP."""
from .api import CompileRequest, compile, make_request
from .options import CompileOptions

__all__ = ["CompileOptions", "CompileRequest", "compile", "make_request"]
