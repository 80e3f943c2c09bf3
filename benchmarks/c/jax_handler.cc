// The C++ XLA FFI handler a JAX user would write by hand for one kernel, for the `jax`
// benchmark (benchmarks/jax_ops.py): it launches the same CUfunction kjit's op launches
// (its address an attribute), with the same grid, on XLA's stream. Built at benchmark time
// against jaxlib's headers (jax.ffi.include_dir()); declared command-buffer compatible, as
// kjit's handler is.
#include <dlfcn.h>
#include <cstdint>
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;
typedef int (*launch_fn)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                         unsigned, void*, void**, void**);
static launch_fn cu_launch = nullptr;

extern "C" int bench_bind() {
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (!h) h = dlopen("libcuda.so.1", RTLD_NOW);
  cu_launch = h ? (launch_fn)dlsym(h, "cuLaunchKernel") : nullptr;
  return cu_launch ? 0 : 1;
}

static ffi::Error Launch(void* stream, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y,
                         int64_t fn, int32_t n) {
  void* xp = x.untyped_data();
  void* yp = y->untyped_data();
  void* params[] = {&xp, &yp, &n};
  int r = cu_launch(reinterpret_cast<void*>(fn), (n + 255) / 256, 1, 1, 256, 1, 1, 0, stream,
                    params, nullptr);
  if (r != 0) return ffi::Error(ffi::ErrorCode::kInternal, "cuLaunchKernel failed");
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(BenchLaunch, Launch,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<void*>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("fn")
                                  .Attr<int32_t>("n"),
                              {ffi::Traits::kCmdBufferCompatible});
