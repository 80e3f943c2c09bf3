// kjit device-side <string.h>: the same as <cstring>. (<string>, std::string, is host-only.)
#include "cstring"
