// kjit device-side <stdint.h>: the same as <cstdint>.
#include "cstdint"
