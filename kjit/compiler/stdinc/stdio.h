// kjit device-side <stdio.h>: the same as <cstdio>.
#include "cstdio"
