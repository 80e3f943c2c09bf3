/* A launch's path through the extension's code. Between two launches the driver's work evicts
 * this code from the instruction cache, and a launch pays for each line of it that it runs:
 * its path keeps to what every launch runs, laid out together, and everything else is a call
 * to a function marked OFF_PATH (placed apart, with its callers' branches to it predicted not
 * taken). benchmarks/launch_lines.py counts the lines a launch runs. */
#ifndef KJIT_PATH_H
#define KJIT_PATH_H

#define likely(x) __builtin_expect(!!(x), 1)
#define unlikely(x) __builtin_expect(!!(x), 0)
#define OFF_PATH __attribute__((noinline, cold))

#endif
