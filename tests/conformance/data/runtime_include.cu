// Includes a CUDA toolkit header and defines nothing else (kjit conformance data).
#include <cuda_device_runtime_api.h>
