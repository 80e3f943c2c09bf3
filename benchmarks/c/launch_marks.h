/* Timestamps at the steps of a C launch (kjit/runtime/_launch.c's KJIT_MARK), for
 * benchmarks/launch_marks.py, which builds the extension with this header forced in first
 * (-include). A launch that reaches
 * its last step adds its time between steps to the sums; the time from one launch's return to
 * the next one's entry (Python's loop and call) is `gap`. The Python side reads them with
 * `_launch.marks()`, which also empties them. Ticks: the TSC on x86-64, else nanoseconds. */
#ifndef KJIT_LAUNCH_MARKS_H
#define KJIT_LAUNCH_MARKS_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#if defined(__x86_64__)
#include <x86intrin.h>
static inline uint64_t kjit_ticks(void) { return __rdtsc(); }
#else
#include <time.h>
static inline uint64_t kjit_ticks(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}
#endif

#define KJIT_STEPS 6
static struct {
    uint64_t last, end, step[KJIT_STEPS], sum[KJIT_STEPS], gap, launches, gaps;
} kjit_marks;

static inline void kjit_mark(int step) {
    uint64_t t = kjit_ticks();
    if (step == 0) {
        if (kjit_marks.end) { kjit_marks.gap += t - kjit_marks.end; kjit_marks.gaps++; }
        kjit_marks.end = 0;
    } else {
        kjit_marks.step[step] = t - kjit_marks.last;
    }
    kjit_marks.last = t;
    if (step == KJIT_STEPS - 1) {
        for (int i = 1; i < KJIT_STEPS; i++) kjit_marks.sum[i] += kjit_marks.step[i];
        kjit_marks.launches++;
        kjit_marks.end = t;
    }
}
#define KJIT_MARK(step) kjit_mark(step)

/* marks() -> (launches, gaps, gap ticks, ticks of steps 1..5), emptied; a batch's first launch
 * has no gap (marks_break() forgets the last return) */
static PyObject* kjit_marks_read(PyObject* self, PyObject* noargs) {
    PyObject* r = Py_BuildValue("KKK(KKKKK)", (unsigned long long)kjit_marks.launches,
                                (unsigned long long)kjit_marks.gaps, (unsigned long long)kjit_marks.gap,
                                (unsigned long long)kjit_marks.sum[1], (unsigned long long)kjit_marks.sum[2],
                                (unsigned long long)kjit_marks.sum[3], (unsigned long long)kjit_marks.sum[4],
                                (unsigned long long)kjit_marks.sum[5]);
    memset(&kjit_marks, 0, sizeof kjit_marks);
    return r;
}

/* marks_cost(n) -> ticks one mark adds, over n marks in a row: each step's time includes one */
static PyObject* kjit_marks_cost(PyObject* self, PyObject* arg) {
    long n = PyLong_AsLong(arg);
    if (n <= 0) return PyErr_Occurred() ? NULL : PyErr_Format(PyExc_ValueError, "marks_cost(n > 0)");
    uint64_t t0 = kjit_ticks();
    for (long i = 0; i < n; i++) kjit_mark(1 + (int)(i % (KJIT_STEPS - 2)));
    uint64_t t1 = kjit_ticks();
    memset(&kjit_marks, 0, sizeof kjit_marks);
    return PyFloat_FromDouble((double)(t1 - t0) / (double)n);
}

static PyObject* kjit_marks_now(PyObject* self, PyObject* noargs) {
    return PyLong_FromUnsignedLongLong(kjit_ticks());
}

#define KJIT_MARKS_METHODS \
    {"marks", (PyCFunction)kjit_marks_read, METH_NOARGS, "marks() -> launch step sums, emptied"}, \
    {"marks_cost", (PyCFunction)kjit_marks_cost, METH_O, "marks_cost(n) -> ticks per mark"}, \
    {"marks_now", (PyCFunction)kjit_marks_now, METH_NOARGS, "the tick counter"},
#endif
