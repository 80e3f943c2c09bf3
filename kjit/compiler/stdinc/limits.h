// kjit device-side <limits.h>: the same as <climits>.
#include "climits"
