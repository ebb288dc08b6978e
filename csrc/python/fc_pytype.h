/* fc_pytype.h: an object's type name for error messages. _C is built on the stable ABI
 * (Py_LIMITED_API 3.10, setup.py), where PyTypeObject is opaque: no tp_name, and
 * PyType_GetName only from 3.11, so the name comes from type(obj).__name__. */
#ifndef FC_PYTYPE_H
#define FC_PYTYPE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdio.h>

/* type(obj).__name__ into buf (truncated to cap), "?" if it cannot be read; returns buf. Keeps a
 * pending exception as it was: it is called while one is being reported. */
static inline const char *fc_type_name(PyObject *obj, char *buf, size_t cap)
{
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    PyObject *name = PyObject_GetAttrString((PyObject *)Py_TYPE(obj), "__name__");
    const char *s = name != NULL && PyUnicode_Check(name) ? PyUnicode_AsUTF8AndSize(name, NULL) : NULL;
    snprintf(buf, cap, "%s", s != NULL ? s : "?");
    Py_XDECREF(name);
    PyErr_Clear();
    PyErr_Restore(et, ev, tb);
    return buf;
}

/* fc_type_name into a compound literal, which lives until the end of the enclosing block. */
#define FC_TYPE_NAME(obj) fc_type_name((obj), (char[96]){0}, 96)

#endif
