/*
 * The builtin modules of the netclaim executable.
 *
 * Defining _PyImport_Inittab here keeps the linker from pulling libpython's
 * own config.o, so only these modules (and the C libraries they need) end up
 * in the binary. Left out on purpose: pwd, grp, spwd (glibc NSS, which cannot
 * work in a static binary), zlib and pyexpat (extra static libraries) and
 * everything the plugin never imports. _json is compiled from the matching
 * CPython source; _netclaim_sys is ours (setns).
 */
#include <Python.h>

#define MODULES(X) \
    X(posix) X(errno) X(_io) X(_abc) X(_codecs) X(_collections) X(_functools) \
    X(_locale) X(_operator) X(_signal) X(_sre) X(_stat) X(_thread) X(_tracemalloc) \
    X(_weakref) X(atexit) X(faulthandler) X(itertools) X(time) X(_socket) X(_struct) \
    X(select) X(fcntl) X(math) X(_bisect) X(_heapq) X(_opcode) X(_symtable) \
    X(_json) X(_netclaim_sys)

#define DECLARE(name) extern PyObject *PyInit_##name(void);
#define ENTRY(name) {#name, PyInit_##name},

MODULES(DECLARE)
extern PyObject *PyMarshal_Init(void);
extern PyObject *PyInit__imp(void);
extern PyObject *PyInit__ast(void);
extern PyObject *PyInit__tokenize(void);
extern PyObject *PyInit_gc(void);
extern PyObject *_PyWarnings_Init(void);
extern PyObject *PyInit__string(void);

struct _inittab _PyImport_Inittab[] = {
    MODULES(ENTRY)
    {"marshal", PyMarshal_Init},
    {"_imp", PyInit__imp},
    {"_ast", PyInit__ast},
    {"_tokenize", PyInit__tokenize},
    {"builtins", NULL},
    {"sys", NULL},
    {"gc", PyInit_gc},
    {"_warnings", _PyWarnings_Init},
    {"_string", PyInit__string},
    {0, 0},
};
