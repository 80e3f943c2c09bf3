// kjit device-side <stddef.h>: the same as <cstddef>.
#include "cstddef"
