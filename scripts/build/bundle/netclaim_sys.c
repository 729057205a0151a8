/*
 * _netclaim_sys: the one system call the plugin needs that Python 3.11 lacks.
 *
 * The source plugin binds setns(2) through _ctypes (libffi + dlopen), which a
 * fully static binary cannot have. cni_plugin/lean/netns.py prefers os.setns
 * (3.12+), then this builtin, then _ctypes.
 */
#define PY_SSIZE_T_CLEAN
#define _GNU_SOURCE
#include <Python.h>
#include <errno.h>
#include <sched.h>

static PyObject *
netclaim_setns(PyObject *module, PyObject *args)
{
    int fd, nstype, rc;

    if (!PyArg_ParseTuple(args, "ii:setns", &fd, &nstype)) {
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    rc = setns(fd, nstype);
    Py_END_ALLOW_THREADS
    if (rc != 0) {
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_RETURN_NONE;
}

static PyMethodDef netclaim_sys_methods[] = {
    {"setns", netclaim_setns, METH_VARARGS,
     "setns(fd, nstype): move this thread into the namespace open at fd."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef netclaim_sys_module = {
    PyModuleDef_HEAD_INIT, "_netclaim_sys",
    "System calls the netclaim plugin needs and Python 3.11 lacks.", 0,
    netclaim_sys_methods,
};

PyMODINIT_FUNC
PyInit__netclaim_sys(void)
{
    return PyModule_Create(&netclaim_sys_module);
}
