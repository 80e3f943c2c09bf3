// kjit device-side <stdlib.h>: the same as <cstdlib>.
#include "cstdlib"
