/* module.c: fsdpcomp._C itself: multi-phase init, the module state and functions, and the one
 * translator from fc_err to exceptions (the State type lives in state_*.c). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "python/state.h"
#include "python/fc_config.h"
#include "python/fc_suggest.h"
#include "methods/fc_adaptive.h"
#include "methods/fc_simd.h"
#include "common/fc_wire.h"

/* The one translator from a C status to a Python exception. Returns NULL for `return`. */
PyObject *fc_raise_err(module_state *st, const fc_err *err)
{
    PyObject *exc;
    switch (err->code) {
    case FC_ERR_TYPE:
        exc = PyExc_TypeError;
        break;
    case FC_ERR_NOMEM:
        exc = PyExc_MemoryError;
        break;
    case FC_ERR_PAYLOAD:
        exc = st->payload_error;
        break;
    case FC_ERR_CUDA:
        exc = st->cuda_error;
        break;
    case FC_ERR_STATE:
        exc = PyExc_RuntimeError;
        break;
    case FC_ERR_PYTHON:
        return NULL; /* already set */
    default:
        exc = PyExc_ValueError;
        break;
    }
    PyErr_SetString(exc, err->msg[0] ? err->msg : "fsdpcomp: unknown error");
    return NULL;
}

/* ---------------------------------------------------------------- module functions */

#define NEAR_MAX 256 /* names a suggestion looks at: every method or key list is far shorter */

PyDoc_STRVAR(methods_doc, "methods() -> tuple[str, ...]\n\nThe registered compressor names.");

static PyObject *mod_methods(PyObject *mod, PyObject *Py_UNUSED(ignored))
{
    (void)mod;
    PyObject *t = PyTuple_New(fc_method_count());
    for (int i = 0; t != NULL && i < fc_method_count(); i++) {
        PyObject *s = PyUnicode_FromString(fc_method_at(i)->name);
        if (s == NULL) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SetItem(t, i, s);
    }
    return t;
}

PyDoc_STRVAR(method_info_doc,
"method_info(name) -> dict\n\nid, summary, properties and config keys (name, type, default,\n"
"range, choices, doc) of one method, and its aliases (other names it takes for a value:\n"
"num_bits); method_info('') describes the common keys.");

static PyObject *mod_method_info(PyObject *mod, PyObject *arg)
{
    (void)mod;
    const char *name = PyUnicode_AsUTF8AndSize(arg, NULL);
    if (name == NULL)
        return NULL;
    if (name[0] == '\0')
        return fc_keys_info(fc_common_keys);
    const fc_method *m = fc_method_by_name(name);
    if (m == NULL) {
        const char *names[NEAR_MAX];
        int count = fc_method_count() < NEAR_MAX ? fc_method_count() : NEAR_MAX;
        for (int i = 0; i < count; i++)
            names[i] = fc_method_at(i)->name;
        const char *near = fc_near_name(name, names, (size_t)count);
        PyErr_Format(PyExc_ValueError, "unknown compression method '%s'%s%s%s", name,
                     near ? " (did you mean '" : "", near ? near : "", near ? "'?)" : "");
        return NULL;
    }
    unsigned f = m->flags;
    /* error feedback in the default config (a method's ef_default may refine its flag) */
    fc_common common;
    _Alignas(16) unsigned char cfg[FC_CFG_MAX];
    fc_err err = {0};
    int ef = (f & FC_EF_DEFAULT) != 0;
    if (fc_config_parse(m, NULL, &common, cfg, &err) == FC_OK)
        ef = common.error_feedback;
    return Py_BuildValue("{s:s,s:i,s:s,s:O,s:O,s:O,s:O,s:O,s:N,s:N}", "name", m->name, "id", m->id,
                         "summary", m->summary, "unbiased", (f & FC_UNBIASED) ? Py_True : Py_False,
                         "linear", (f & FC_LINEAR) ? Py_True : Py_False, "random",
                         (f & FC_RANDOM) ? Py_True : Py_False, "varsize",
                         (f & FC_VARSIZE) ? Py_True : Py_False, "error_feedback_default",
                         ef ? Py_True : Py_False, "keys", fc_keys_info(m->keys), "aliases",
                         fc_aliases_info(m));
}

PyDoc_STRVAR(adaptive_ladder_doc,
"adaptive_ladder() -> list[dict]\n\n'adaptive''s ladder, the codecs a parts table names by index:\n"
"[{'name': str, 'method': str, 'config': dict}, ...] (config: the keys set over the method's\n"
"defaults). fsdpcomp._budget.LADDER is the same list.");

static PyObject *mod_adaptive_ladder(PyObject *mod, PyObject *Py_UNUSED(ignored))
{
    (void)mod;
    PyObject *list = PyList_New(FC_ADAPTIVE_RUNGS), *cfg = NULL;
    for (int r = 0; list != NULL && r < FC_ADAPTIVE_RUNGS; r++) {
        const fc_rung *g = &fc_adaptive_ladder[r];
        if ((cfg = PyDict_New()) == NULL)
            goto error;
        for (int i = 0; i < FC_RUNG_SETS && g->set[i].key != NULL; i++) {
            PyObject *v = g->set[i].choice ? PyUnicode_FromString(g->set[i].choice)
                                           : PyLong_FromLongLong((long long)g->set[i].value);
            if (v == NULL || PyDict_SetItemString(cfg, g->set[i].key, v) < 0) {
                Py_XDECREF(v);
                goto error;
            }
            Py_DECREF(v);
        }
        PyObject *item = Py_BuildValue("{s:s,s:s,s:N}", "name", g->name, "method", g->method,
                                       "config", cfg);
        cfg = NULL; /* the item owns it now (N), or it was released with the failure */
        if (item == NULL)
            goto error;
        PyList_SetItem(list, r, item); /* steals item; cannot fail on a fresh list */
    }
    return list;
error:
    Py_XDECREF(cfg);
    Py_XDECREF(list);
    return NULL;
}

PyDoc_STRVAR(cuda_info_doc,
"cuda_info() -> dict\n\nLoads the CUDA library if it is not yet loaded and says whether that\n"
"worked: {'available': bool, 'path': str, 'error': str or None, 'build': str or None}.");

static PyObject *mod_cuda_info(PyObject *mod, PyObject *Py_UNUSED(ignored))
{
    (void)mod;
    fc_err err = {0};
    const fc_cuda_api *api = fc_cuda_api_get(&err);
    return Py_BuildValue("{s:O,s:s,s:z,s:z}", "available", api ? Py_True : Py_False, "path",
                         fc_cuda_lib_path(), "error", api ? NULL : err.msg, "build",
                         api ? api->build : NULL);
}

PyDoc_STRVAR(cuda_loaded_doc, "cuda_loaded() -> bool\n\nWhether the CUDA library is loaded (never loads it).");

static PyObject *mod_cuda_loaded(PyObject *mod, PyObject *Py_UNUSED(ignored))
{
    (void)mod;
    return PyBool_FromLong(fc_cuda_api_loaded() != NULL);
}

PyDoc_STRVAR(reference_kernels_doc,
"_reference_kernels(on) -> bool\n\nTests only: True sends every CPU encode/decode to the scalar\n"
"reference loops instead of the fast paths (which must give the same bytes); returns the\n"
"previous setting. Process-wide; not for use while other threads compress.");

static PyObject *mod_reference_kernels(PyObject *mod, PyObject *arg)
{
    (void)mod;
    const int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
    const int prev = fc_cpu_reference;
    fc_cpu_reference = on;
    return PyBool_FromLong(prev);
}

PyDoc_STRVAR(near_name_doc,
"near_name(name, candidates) -> str | None\n\nThe candidate that `name` most likely misspells\n"
"(case, '_' and '-' aside; one or two typed letters off; a '_'-joined prefix), or None: what\n"
"every refusal of an unknown method or key suggests.");

static PyObject *mod_near_name(PyObject *mod, PyObject *args)
{
    (void)mod;
    const char *name;
    PyObject *cands;
    if (!PyArg_ParseTuple(args, "sO:near_name", &name, &cands))
        return NULL;
    PyObject *list = PySequence_List(cands); /* borrowed items, alive while list is */
    if (list == NULL)
        return NULL;
    const char *names[NEAR_MAX];
    Py_ssize_t n = PyList_Size(list);
    n = n < NEAR_MAX ? n : NEAR_MAX;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GetItem(list, i);
        names[i] = PyUnicode_Check(item) ? PyUnicode_AsUTF8AndSize(item, NULL) : NULL;
        if (names[i] == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "near_name: candidates must be a sequence of str");
            Py_DECREF(list);
            return NULL;
        }
    }
    const char *near = fc_near_name(name, names, (size_t)n);
    PyObject *out = near != NULL ? PyUnicode_FromString(near) : Py_NewRef(Py_None);
    Py_DECREF(list); /* near points into one of its strings: copied above first */
    return out;
}

static PyMethodDef module_functions[] = {
    {"methods", mod_methods, METH_NOARGS, methods_doc},
    {"method_info", mod_method_info, METH_O, method_info_doc},
    {"cuda_info", mod_cuda_info, METH_NOARGS, cuda_info_doc},
    {"adaptive_ladder", mod_adaptive_ladder, METH_NOARGS, adaptive_ladder_doc},
    {"cuda_loaded", mod_cuda_loaded, METH_NOARGS, cuda_loaded_doc},
    {"_reference_kernels", mod_reference_kernels, METH_O, reference_kernels_doc},
    {"near_name", mod_near_name, METH_VARARGS, near_name_doc},
    {NULL},
};

/* ---------------------------------------------------------------- module lifecycle */

static int module_exec(PyObject *mod)
{
    module_state *st = (module_state *)PyModule_GetState(mod);
    st->state_type = (PyTypeObject *)PyType_FromModuleAndSpec(mod, &fc_state_spec, NULL);
    if (st->state_type == NULL || PyModule_AddType(mod, st->state_type) < 0)
        return -1;
    st->payload_error = PyErr_NewExceptionWithDoc(
        "fsdpcomp._C.PayloadError", "A payload on the wire is malformed, truncated or from a rank "
        "that is out of step.", PyExc_ValueError, NULL);
    st->cuda_error = PyErr_NewExceptionWithDoc("fsdpcomp._C.CudaError", "A CUDA call failed.",
                                               PyExc_RuntimeError, NULL);
    if (st->payload_error == NULL || st->cuda_error == NULL)
        return -1;
    if (PyModule_AddObjectRef(mod, "PayloadError", st->payload_error) < 0 ||
        PyModule_AddObjectRef(mod, "CudaError", st->cuda_error) < 0)
        return -1;
    if (PyModule_AddIntConstant(mod, "HEADER_BYTES", FC_HEADER_BYTES) < 0 ||
        PyModule_AddIntConstant(mod, "ALIGN", FC_ALIGN) < 0 ||
        PyModule_AddIntConstant(mod, "WIRE_VERSION", FC_WIRE_VERSION) < 0 ||
        PyModule_AddIntConstant(mod, "MAX_WORLD", FC_MAX_WORLD) < 0)
        return -1;
    PyObject *removed = fc_removed_keys();
    const int rc = removed == NULL ? -1 : PyModule_AddObjectRef(mod, "REMOVED_KEYS", removed);
    Py_XDECREF(removed);
    return rc;
}

static int module_traverse(PyObject *mod, visitproc visit, void *arg)
{
    module_state *st = (module_state *)PyModule_GetState(mod);
    Py_VISIT(st->state_type);
    Py_VISIT(st->payload_error);
    Py_VISIT(st->cuda_error);
    return 0;
}

static int module_clear(PyObject *mod)
{
    module_state *st = (module_state *)PyModule_GetState(mod);
    Py_CLEAR(st->state_type);
    Py_CLEAR(st->payload_error);
    Py_CLEAR(st->cuda_error);
    return 0;
}

static void module_free(void *mod)
{
    module_clear((PyObject *)mod);
}

static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, module_exec},
    {0, NULL},
};

PyDoc_STRVAR(module_doc, "fsdpcomp._C: compressors, residuals, counters and the compressed "
                         "reduce-scatter, in C.");

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "fsdpcomp._C",
    .m_doc = module_doc,
    .m_size = sizeof(module_state),
    .m_methods = module_functions,
    .m_slots = module_slots,
    .m_traverse = module_traverse,
    .m_clear = module_clear,
    .m_free = module_free,
};

PyMODINIT_FUNC PyInit__C(void)
{
    return PyModuleDef_Init(&module_def);
}
