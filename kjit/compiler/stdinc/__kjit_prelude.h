// kjit's nvcc prelude: what device code gets under nvcc without an #include. nvcc includes
// cuda_runtime.h into every .cu file, and through it <math.h>, <stdlib.h> and, with glibc,
// <sys/types.h>; kernels written for nvcc use INFINITY, M_PI, FLT_MAX or uint without
// including anything. NVRTC includes nothing, so kjit pre-includes this header (no includes:
// CCCL's <cuda/std/limits> alone costs a second per compile).
// Off with CompileOptions(nvcc_prelude=False) / --no-nvcc-prelude.
#ifndef __KJIT_PRELUDE
#define __KJIT_PRELUDE

// <sys/types.h>
typedef unsigned int uint;
typedef unsigned short ushort;
typedef unsigned long ulong;

// <math.h>: INFINITY, NAN and HUGE_VAL(F) as constants rather than macros, so that CCCL's
// <cuda/std/cmath>, which defines the macros for NVRTC, redefines nothing.
#if __cplusplus >= 201103L
static __device__ constexpr float INFINITY = __builtin_bit_cast(float, 0x7f800000u);
static __device__ constexpr float NAN = __builtin_bit_cast(float, 0x7fc00000u);
static __device__ constexpr float HUGE_VALF = __builtin_bit_cast(float, 0x7f800000u);
static __device__ constexpr double HUGE_VAL = __builtin_bit_cast(double, 0x7ff0000000000000ull);
#else  // C++03 has no constexpr (nor CCCL, so nothing redefines these)
#define INFINITY __int_as_float(0x7f800000)
#define NAN __int_as_float(0x7fc00000)
#define HUGE_VALF __int_as_float(0x7f800000)
#define HUGE_VAL __longlong_as_double(0x7ff0000000000000ll)
#endif
// glibc's math constants, as kjit's <cmath> defines them
#ifndef M_PI
#define M_E        2.7182818284590452354   /* e */
#define M_LOG2E    1.4426950408889634074   /* log_2 e */
#define M_LOG10E   0.43429448190325182765  /* log_10 e */
#define M_LN2      0.69314718055994530942  /* log_e 2 */
#define M_LN10     2.30258509299404568402  /* log_e 10 */
#define M_PI       3.14159265358979323846  /* pi */
#define M_PI_2     1.57079632679489661923  /* pi/2 */
#define M_PI_4     0.78539816339744830962  /* pi/4 */
#define M_1_PI     0.31830988618379067154  /* 1/pi */
#define M_2_PI     0.63661977236758134308  /* 2/pi */
#define M_2_SQRTPI 1.12837916709551257390  /* 2/sqrt(pi) */
#define M_SQRT2    1.41421356237309504880  /* sqrt(2) */
#define M_SQRT1_2  0.70710678118654752440  /* 1/sqrt(2) */
#endif

// <float.h> and <limits.h>, spelled as CCCL's <cuda/std/cfloat> and <cuda/std/climits> spell
// them for NVRTC, so that including those later redefines each macro identically.
#define FLT_RADIX       2
#define FLT_DECIMAL_DIG 9
#define FLT_MIN         1.17549435082228750796873653722224568e-38f
#define FLT_TRUE_MIN    1.40129846432481707092372958328991613e-45f
#define FLT_MAX         3.40282346638528859811704183484516925e+38f
#define FLT_EPSILON     1.19209289550781250000000000000000000e-7f
#define FLT_DIG         6
#define FLT_MANT_DIG    24
#define FLT_MIN_EXP     (-125)
#define FLT_MIN_10_EXP  (-37)
#define FLT_MAX_EXP     128
#define FLT_MAX_10_EXP  38
#define DBL_DECIMAL_DIG 17
#define DBL_MIN         2.22507385850720138309023271733240406e-308
#define DBL_TRUE_MIN    4.94065645841246544176568792868221372e-324
#define DBL_MAX         1.79769313486231570814527423731704357e+308
#define DBL_EPSILON     2.22044604925031308084726333618164062e-16
#define DBL_DIG         15
#define DBL_MANT_DIG    53
#define DBL_MIN_EXP     (-1021)
#define DBL_MIN_10_EXP  (-307)
#define DBL_MAX_EXP     1024
#define DBL_MAX_10_EXP  308

#define CHAR_BIT 8
#define SCHAR_MIN (-128)
#define SCHAR_MAX 127
#define UCHAR_MAX 255
#define SHRT_MIN  (-SHRT_MAX - 1)
#define SHRT_MAX  0x7fff
#define USHRT_MAX 0xffff
#define INT_MIN   (-INT_MAX - 1)
#define INT_MAX   0x7fffffff
#define UINT_MAX  0xffffffff
#define LLONG_MIN  (-LLONG_MAX - 1)
#define LLONG_MAX  0x7fffffffffffffffLL
#define ULLONG_MAX 0xffffffffffffffffUL
#define LONG_MIN  (-LONG_MAX - 1)
#ifdef __LP64__
#define LONG_MAX  LLONG_MAX
#define ULONG_MAX ULLONG_MAX
#else
#define LONG_MAX  INT_MAX
#define ULONG_MAX UINT_MAX
#endif

#endif  // __KJIT_PRELUDE
