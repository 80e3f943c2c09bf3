// The headers built on CCCL's cuda::std include this first: CCCL needs C++17, and its own
// #error ("libcu++ requires at least C++ 17") would not say how to get past it under kjit.
#ifndef __KJIT_CCCL_H
#define __KJIT_CCCL_H
#include "__kjit_std_config.h"
#if __cplusplus < 201703L
#error kjit standard headers map std:: onto CCCL's cuda::std, which needs C++17 or later: compile with std="c++17" (NVRTC's default) or newer, or turn them off with CompileOptions(std_headers=False) / --no-std-headers
#endif
#endif
