// kjit device-side <math.h>: the same as <cmath>.
#include "cmath"
