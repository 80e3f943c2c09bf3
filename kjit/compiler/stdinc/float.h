// kjit device-side <float.h>: the same as <cfloat>.
#include "cfloat"
