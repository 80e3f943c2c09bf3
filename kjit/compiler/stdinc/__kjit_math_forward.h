// __KJIT_STD_MATH(f) declares std::f as NVRTC's ::f plus a template that forwards any other
// argument types to cuda::std::f (shared by <cmath> and <cstdlib>, which both declare std::abs).
#ifndef __KJIT_MATH_FORWARD_H
#define __KJIT_MATH_FORWARD_H
#define __KJIT_STD_MATH(F)                                                              \
  using ::F;                                                                            \
  template <class... _KjitArgs>                                                         \
  __host__ __device__ inline auto F(_KjitArgs... __args) -> decltype(::cuda::std::F(__args...)) \
  {                                                                                     \
    return ::cuda::std::F(__args...);                                                   \
  }
#endif
