// kjit device-side <assert.h>: the same as <cassert> (re-evaluated at each inclusion).
#include "cassert"
