// kjit's device-side standard headers (kjit/compiler/stdinc): shared prologue.
// These headers are the last -I directory of every NVRTC compile (CompileOptions.std_headers),
// so a header of the same name in the user's or the toolkit's directories wins.
#ifndef __KJIT_STD_CONFIG_H
#define __KJIT_STD_CONFIG_H
// The set's version: bumped with any change that is not already visible in the files' text
// (the cache key hashes the text of every header a compile can read).
#define __KJIT_STD_HEADERS 1

// glibc's <sys/types.h> typedefs. nvcc code gets them through <stdlib.h>, which every nvcc
// compile includes (cuda_runtime.h pulls it in for the host side), so kernels use uint with
// any standard header or none; every header of this set declares them.
typedef unsigned int uint;
typedef unsigned short ushort;
typedef unsigned long ulong;
#endif
