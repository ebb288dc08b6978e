/* fc_config.c: config dicts to C structs. One generic parser over declarative key tables, so
 * every method's keys get the same checks and the same error messages. */
#include "python/fc_config.h"
#include "python/fc_suggest.h"
#include "python/fc_pytype.h"

#include <math.h>
#include <string.h>

/* text of a str, refused (NULL, err set) when it holds a NUL: C compares up to the first one,
 * so "bf16\0x" would match "bf16" */
static const char *text_of(PyObject *v, const char *method, const char *what, fc_err *err)
{
    Py_ssize_t len;
    const char *s = PyUnicode_AsUTF8AndSize(v, &len);
    if (s == NULL) {
        PyErr_Clear();
        fc_fail(err, FC_ERR_VALUE, "%s %s is not valid text", method, what);
        return NULL;
    }
    if ((size_t)len != strlen(s)) {
        fc_fail(err, FC_ERR_VALUE, "%s %s '%s' (and more) contains an embedded NUL character",
                method, what, s);
        return NULL;
    }
    return s;
}

static const char *const residual_dtypes[] = {"fp32", "bf16", "int8", NULL};
static const char *const nonfinite_modes[] = {"pass", "zero", NULL};
/* The parameter codecs: each is the method of the same name (fsdpcomp/param_gather.py). */
static const char *const param_codecs[] = {"none", "bf16", "fp8", "int8", NULL};

const fc_key fc_common_keys[] = {
    /* error feedback, the residual dtype, the statistics and the non-finite policy are each
     * rank's own (FC_KEY_LOCAL): payloads mean the same whatever they are */
    FC_BOOL_LOCAL(fc_common, error_feedback, 0,
                  "keep e = g' - D(C(g')) per unit and add it to the next gradient"),
    FC_FLOAT(fc_common, ef_decay, 1.0, 0.0, 1.0, FC_KEY_LOCAL,
             "error feedback: g' = g + ef_decay * e, a decaying residual (DeMo's momentum "
             "accumulator below 1; 1: plain error feedback)"),
    FC_CHOICE_LOCAL(fc_common, residual_dtype, 0, residual_dtypes, "dtype the residuals are kept in"),
    FC_INT(fc_common, seed, 0, 0, 9007199254740991.0, 0,
           "seed of the counter-based generator (stochastic rounding, random choices)"),
    FC_INT(fc_common, min_numel, 0, 0, 9007199254740991.0, 0,
           "units with fewer elements go uncompressed (sent as `none`)"),
    FC_BOOL(fc_common, compress_own_chunk, 0,
            "also compress the chunk this rank keeps (one-GPU experiments; counted as sent)"),
    FC_INT(fc_common, error_stats_every, 8, 0, 2147483647.0, FC_KEY_LOCAL,
           "sample the compression error every this many calls (0: never)"),
    FC_CHOICE_LOCAL(fc_common, nonfinite, 0, nonfinite_modes,
                    "NaN/Inf in a gradient: pass them through, or zero them (both counted)"),
    /* removed 2026-11-28 (docs/decisions.md): it was a choice between torch.distributed and an
     * own NCCL path, and part of the fingerprint, where it keeps "auto" (0), its default */
    FC_REMOVED("transport", 0, 0, "every collective goes through torch.distributed (NCCL process "
               "groups on GPUs)"),
    FC_BOOL(fc_common, pipeline, 1,
            "CPU process groups: send each payload as soon as it is encoded and decode each as it "
            "arrives (methods with fixed-size payloads and no compressed-domain sum)"),
    FC_INT(fc_common, pipeline_piece, 1048576, 0, 9007199254740991.0, 0,
           "with pipeline: elements per piece a payload is cut into, so the first piece travels while "
           "the next is encoded (element- and block-wise methods; 0: whole payloads)"),
    FC_BOOL(fc_common, allgather_compress, 1,
            "all-reduces (NO_SHARD, DDP, replica all-reduce): compress the all-gather of the reduced "
            "shards too, where the payload is smaller than the shard; every rank, the owner included, "
            "uses the decoded shards (a method without a single-payload codec on the device goes "
            "uncompressed unless the key is set by name)"),
    /* removed with transport, whose NCCL path alone read it */
    FC_REMOVED("timeout_s", 0, FC_KEY_LOCAL, "it bounded the removed transport's waits, and the "
               "process group's timeout (init_process_group's) bounds every collective"),
    FC_CHOICE(fc_common, param_gather, 0, param_codecs,
              "FSDP2: codec of the parameter all-gathers (nearest rounding; every rank, the owner "
              "included, computes with the decoded weights; the sharded weights stay exact)"),
    FC_INT(fc_common, param_gather_block_size, 256, 8, 16777216.0, FC_KEY_POW2,
           "elements per scale of the fp8/int8 parameter all-gather; a power of two"),
    FC_KEYS_END,
};

static const fc_key *find_key(const fc_key *keys, const char *name)
{
    for (const fc_key *k = keys; k != NULL && k->name != NULL; k++)
        if (strcmp(k->name, name) == 0)
            return k;
    return NULL;
}

static int choices_text(const fc_key *k, char *buf, size_t cap)
{
    size_t used = 0;
    buf[0] = '\0';
    for (const char *const *c = k->choices; *c != NULL; c++)
        used += (size_t)snprintf(buf + used, used < cap ? cap - used : 0, "%s'%s'",
                                 c == k->choices ? "" : ", ", *c);
    return FC_OK;
}

#define REMOVED_TEXT "config key '%s' was removed: %s; drop the key"

static int parse_value(const char *method, const fc_key *k, PyObject *v, void *dst, fc_err *err)
{
    char *p = (char *)dst + k->offset;
    switch (k->kind) {
    case FC_KEY_REMOVED:
        return fc_fail(err, FC_ERR_VALUE, REMOVED_TEXT, k->name, k->doc);
    case FC_KEY_BOOL:
        if (!PyBool_Check(v))
            return fc_fail(err, FC_ERR_VALUE, "%s config key '%s' must be true or false, got %s",
                           method, k->name, FC_TYPE_NAME(v));
        *(int *)p = v == Py_True;
        return FC_OK;
    case FC_KEY_INT: {
        if (!PyLong_Check(v) || PyBool_Check(v))
            return fc_fail(err, FC_ERR_VALUE, "%s config key '%s' must be an integer, got %s",
                           method, k->name, FC_TYPE_NAME(v));
        int overflow = 0;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (x == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            overflow = 1;
        }
        if (overflow)
            return fc_fail(err, FC_ERR_VALUE, "%s config key '%s' must be in [%.17g, %.17g], got an "
                           "integer beyond 64 bits", method, k->name, k->lo, k->hi);
        if ((double)x < k->lo || (double)x > k->hi)
            return fc_fail(err, FC_ERR_VALUE, "%s config key '%s' must be in [%.17g, %.17g], got %lld",
                           method, k->name, k->lo, k->hi, x);
        if ((k->flags & FC_KEY_POW2) && (x & (x - 1)) != 0)
            return fc_fail(err, FC_ERR_VALUE, "%s config key '%s' must be a power of two, got %lld",
                           method, k->name, x);
        *(int64_t *)p = (int64_t)x;
        return FC_OK;
    }
    case FC_KEY_FLOAT: {
        if ((!PyFloat_Check(v) && !PyLong_Check(v)) || PyBool_Check(v))
            return fc_fail(err, FC_ERR_VALUE, "%s config key '%s' must be a number, got %s",
                           method, k->name, FC_TYPE_NAME(v));
        double x = PyFloat_AsDouble(v);
        if (x == -1.0 && PyErr_Occurred()) {
            PyErr_Clear();
            return fc_fail(err, FC_ERR_VALUE, "%s config key '%s' is out of range", method, k->name);
        }
        int low_bad = (k->flags & FC_KEY_OPEN_LO) ? !(x > k->lo) : !(x >= k->lo);
        if (!isfinite(x) || low_bad || !(x <= k->hi))
            return fc_fail(err, FC_ERR_VALUE, "%s config key '%s' must be in %s%.9g, %.9g], got %.9g",
                           method, k->name, (k->flags & FC_KEY_OPEN_LO) ? "(" : "[", k->lo, k->hi, x);
        *(double *)p = x;
        return FC_OK;
    }
    case FC_KEY_CHOICE: {
        char opts[256];
        choices_text(k, opts, sizeof(opts));
        if (!PyUnicode_Check(v))
            return fc_fail(err, FC_ERR_VALUE, "%s config key '%s' must be one of %s, got %s",
                           method, k->name, opts, FC_TYPE_NAME(v));
        char what[96];
        snprintf(what, sizeof(what), "config key '%s' value", k->name);
        const char *s = text_of(v, method, what, err);
        if (s == NULL)
            return err->code;
        for (int i = 0; k->choices[i] != NULL; i++)
            if (strcmp(k->choices[i], s) == 0) {
                *(int *)p = i;
                return FC_OK;
            }
        return fc_fail(err, FC_ERR_VALUE, "%s config key '%s' must be one of %s, got '%s'",
                       method, k->name, opts, s);
    }
    default:
        return fc_fail(err, FC_ERR_VALUE, "internal: key '%s' has no kind", k->name);
    }
}

/* `num_bits`: a quantiser's width as the study this library grew from spells it (its int8 run is
 * '{"num_bits": 8}'). Accepted where it names what the method already has: int8's fixed 8
 * bits, and for a method with a `bits` key (intN) that key itself. An alias, so the resolved
 * config never shows it. */
#define NUM_BITS "num_bits"

/* Methods whose codes have one fixed width (no `bits` key to set). */
static const struct {
    const char *method;
    int64_t bits;
} fixed_bits[] = {{"int8", 8}};

/* What `num_bits` names in method m: its one fixed width (int8: *fixed, *bits NULL) or its
 * `bits` key (intN: *bits); 0 where m has no code width to set. The one place that says which
 * methods take the alias: the parser, the unknown-key message and method_info's "aliases"
 * (fc_aliases_info) all ask it, so no list of valid keys can leave it out. */
static int num_bits_target(const fc_method *m, int64_t *fixed, const fc_key **bits)
{
    *fixed = 0;
    *bits = NULL;
    for (size_t i = 0; i < sizeof(fixed_bits) / sizeof(fixed_bits[0]); i++)
        if (strcmp(m->name, fixed_bits[i].method) == 0) {
            *fixed = fixed_bits[i].bits;
            return 1;
        }
    const fc_key *k = find_key(m->keys, "bits");
    if (k == NULL || k->kind != FC_KEY_INT)
        return 0;
    *bits = k;
    return 1;
}

/* "2, 3 or 4" for an integer key's range. */
static void range_text(const fc_key *k, char *buf, size_t cap)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int64_t v = (int64_t)k->lo; v <= (int64_t)k->hi && used < cap && v - (int64_t)k->lo < 16; v++)
        used += (size_t)snprintf(buf + used, cap - used, "%s%lld",
                                 v == (int64_t)k->lo ? "" : v == (int64_t)k->hi ? " or " : ", ",
                                 (long long)v);
}

static int parse_num_bits(const fc_method *m, PyObject *config, PyObject *v, void *cfg, fc_err *err)
{
    if (!PyLong_Check(v) || PyBool_Check(v))
        return fc_fail(err, FC_ERR_VALUE, "%s config key '" NUM_BITS "' must be an integer, got %s",
                       m->name, FC_TYPE_NAME(v));
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (x == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        overflow = 1;
    }
    int64_t fixed;
    const fc_key *bits;
    if (!num_bits_target(m, &fixed, &bits))
        return fc_fail(err, FC_ERR_VALUE, "config key '" NUM_BITS "' sets the code width of int8 "
                       "(8) or intN (2, 3 or 4, as its key 'bits'); method '%s' has no code width "
                       "to set", m->name);
    if (bits == NULL) {
        if (overflow)
            return fc_fail(err, FC_ERR_VALUE, "%s config key '" NUM_BITS "' must be %lld, got "
                           "an integer beyond 64 bits", m->name, (long long)fixed);
        if (x != fixed)
            return fc_fail(err, FC_ERR_VALUE, "%s config key '" NUM_BITS "' must be %lld (its "
                           "codes have that width; for 2, 3 or 4 bits use intN), got %lld",
                           m->name, (long long)fixed, x);
        return FC_OK;
    }
    char valid[64];
    range_text(bits, valid, sizeof(valid));
    if (overflow)
        return fc_fail(err, FC_ERR_VALUE, "%s config key '" NUM_BITS "' (the same as 'bits') must "
                       "be %s, got an integer beyond 64 bits", m->name, valid);
    if ((double)x < bits->lo || (double)x > bits->hi)
        return fc_fail(err, FC_ERR_VALUE, "%s config key '" NUM_BITS "' (the same as 'bits') must "
                       "be %s, got %lld", m->name, valid, x);
    /* both given: they must agree (a bad 'bits' value gets its own message when it is parsed) */
    PyObject *other = PyDict_GetItemString(config, "bits"); /* borrowed */
    if (other != NULL && PyLong_Check(other) && !PyBool_Check(other)) {
        long long b = PyLong_AsLongLongAndOverflow(other, &overflow);
        if (b == -1 && PyErr_Occurred())
            PyErr_Clear();
        if (overflow || b != x)
            return fc_fail(err, FC_ERR_VALUE, "%s config keys '" NUM_BITS "' (%lld) and 'bits' "
                           "disagree: give one of them", m->name, x);
    }
    *(int64_t *)((char *)cfg + bits->offset) = (int64_t)x;
    return FC_OK;
}

#define MAX_KEY_NAMES 64

/* The names method m takes, in method_info's order (its keys, its aliases, the common keys):
 * what the unknown-key message lists and suggests from. Returns how many (at most `cap`). */
static size_t valid_key_names(const fc_method *m, const char **names, size_t cap)
{
    int64_t fixed;
    const fc_key *bits;
    size_t n = 0;
    for (const fc_key *q = m->keys; q->name != NULL && n < cap; q++)
        names[n++] = q->name;
    if (num_bits_target(m, &fixed, &bits) && n < cap)
        names[n++] = NUM_BITS;
    for (const fc_key *q = fc_common_keys; q->name != NULL && n < cap; q++)
        if (q->kind != FC_KEY_REMOVED)
            names[n++] = q->name;
    return n;
}

/* The refusal of an unknown key: its near match first when there is one (fc_near_name), then
 * every valid key ("block_size, stochastic, num_bits, error_feedback, ..."). */
static int unknown_key(const fc_method *m, const char *name, fc_err *err)
{
    const char *names[MAX_KEY_NAMES];
    const size_t n = valid_key_names(m, names, MAX_KEY_NAMES);
    char known[768], hint[96] = "";
    size_t used = 0;
    known[0] = '\0';
    for (size_t i = 0; i < n; i++)
        used += (size_t)snprintf(known + used, used < sizeof(known) ? sizeof(known) - used : 0, "%s%s",
                                 i ? ", " : "", names[i]);
    const char *near = fc_near_name(name, names, n);
    if (near != NULL)
        snprintf(hint, sizeof(hint), " (did you mean '%s'?)", near);
    return fc_fail(err, FC_ERR_VALUE, "unknown config key '%s' for method '%s'%s; valid keys: %s", name,
                   m->name, hint, known);
}

PyObject *fc_removed_keys(void)
{
    PyObject *out = PyDict_New();
    for (const fc_key *k = fc_common_keys; out != NULL && k->name != NULL; k++) {
        if (k->kind != FC_KEY_REMOVED)
            continue;
        PyObject *why = PyUnicode_FromFormat(REMOVED_TEXT, k->name, k->doc);
        if (why == NULL || PyDict_SetItemString(out, k->name, why) < 0)
            Py_CLEAR(out);
        Py_XDECREF(why);
    }
    return out;
}

PyObject *fc_aliases_info(const fc_method *m)
{
    int64_t fixed;
    const fc_key *bits;
    if (!num_bits_target(m, &fixed, &bits))
        return PyList_New(0);
    const char *doc = bits ? "the same as 'bits', as the study this library grew from spells a quantiser's "
                             "width (the resolved config shows 'bits')"
                           : "the width of the codes, as the study this library grew from spells it: "
                             "accepted as their one width, min = max (the resolved config does not show it)";
    return Py_BuildValue("[{s:s,s:s,s:z,s:d,s:d,s:s}]", "name", NUM_BITS, "type", "int", "same_as",
                         bits ? bits->name : NULL, "min", bits ? bits->lo : (double)fixed, "max",
                         bits ? bits->hi : (double)fixed, "doc", doc);
}

int fc_config_parse(const fc_method *m, PyObject *config, fc_common *common, void *cfg, fc_err *err)
{
    fc_keys_defaults(fc_common_keys, common);
    common->error_feedback = (m->flags & FC_EF_DEFAULT) != 0;
    memset(cfg, 0, FC_CFG_MAX);
    fc_keys_defaults(m->keys, cfg);
    if (config == NULL || config == Py_None) {
        if (m->ef_default != NULL)
            common->error_feedback = m->ef_default(cfg);
        return m->check ? m->check(cfg, err) : FC_OK;
    }
    if (!PyDict_Check(config))
        return fc_fail(err, FC_ERR_TYPE, "config must be a dict (or None), got %s",
                       FC_TYPE_NAME(config));
    PyObject *key, *value; /* borrowed */
    Py_ssize_t pos = 0;
    int ef_given = 0;
    while (PyDict_Next(config, &pos, &key, &value)) {
        if (!PyUnicode_Check(key))
            return fc_fail(err, FC_ERR_VALUE, "config keys must be strings, got %s",
                           FC_TYPE_NAME(key));
        const char *name = text_of(key, m->name, "config key", err);
        if (name == NULL)
            return err->code;
        if (strcmp(name, NUM_BITS) == 0) {
            int rc = parse_num_bits(m, config, value, cfg, err);
            if (rc != FC_OK)
                return rc;
            continue;
        }
        const fc_key *k = find_key(m->keys, name);
        void *dst = cfg;
        if (k == NULL) {
            k = find_key(fc_common_keys, name);
            dst = common;
        }
        if (k == NULL)
            return unknown_key(m, name, err);
        /* {"k": 0.01}: a fraction, meant for the key that takes one */
        if (k->kind == FC_KEY_INT && PyFloat_Check(value) && find_key(m->keys, "ratio") != NULL &&
            strcmp(k->name, "ratio") != 0)
            return fc_fail(err, FC_ERR_VALUE, "%s config key '%s' must be an integer, got float; for a "
                           "fraction of the elements use 'ratio' (e.g. {\"ratio\": %g})", m->name, k->name,
                           PyFloat_AsDouble(value));
        int rc = parse_value(m->name, k, value, dst, err);
        if (rc != FC_OK)
            return rc;
        ef_given |= dst == (void *)common && k->offset == offsetof(fc_common, error_feedback);
    }
    if (m->ef_default != NULL && !ef_given)
        common->error_feedback = m->ef_default(cfg);
    return m->check ? m->check(cfg, err) : FC_OK;
}

/* FNV-1a, 64-bit: a plain hash that any rank computes alike from the same bytes. */
static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = (const unsigned char *)p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

static uint64_t fingerprint_keys(uint64_t h, const fc_key *keys, const void *src)
{
    for (const fc_key *k = keys; k->name != NULL; k++) {
        if (k->flags & FC_KEY_LOCAL)
            continue;
        const char *p = (const char *)src + k->offset;
        int64_t v = 0; /* every kind as 8 bytes: ints widened, doubles by their bits */
        if (k->kind == FC_KEY_REMOVED) {
            v = (int64_t)k->def;
        } else if (k->kind == FC_KEY_BOOL || k->kind == FC_KEY_CHOICE) {
            int i;
            memcpy(&i, p, sizeof(i));
            v = i;
        } else {
            memcpy(&v, p, 8);
        }
        h = fnv(h, k->name, strlen(k->name) + 1);
        h = fnv(h, &v, 8);
    }
    return h;
}

uint32_t fc_config_fingerprint(const fc_method *m, const fc_common *common, const void *cfg)
{
    uint64_t h = fnv(0xcbf29ce484222325ull, m->name, strlen(m->name) + 1);
    h = fingerprint_keys(h, m->keys, cfg);
    h = fingerprint_keys(h, fc_common_keys, common);
    return (uint32_t)(h ^ (h >> 32)); /* the header's 32 bits */
}

int fc_config_wire_dict(const fc_method *m, const fc_common *common, const void *cfg,
                        PyObject *into)
{
    const fc_key *tables[2] = {m->keys, fc_common_keys};
    const void *srcs[2] = {cfg, common};
    PyObject *all = PyDict_New();
    int rc = all == NULL ? -1 : 0;
    for (int t = 0; rc == 0 && t < 2; t++) {
        rc = fc_config_to_dict(tables[t], srcs[t], all);
        for (const fc_key *k = tables[t]; rc == 0 && k->name != NULL; k++) {
            if ((k->flags & FC_KEY_LOCAL) || k->kind == FC_KEY_REMOVED)
                continue;
            PyObject *v = PyDict_GetItemString(all, k->name); /* borrowed */
            rc = v == NULL ? -1 : PyDict_SetItemString(into, k->name, v);
        }
    }
    Py_XDECREF(all);
    return rc;
}

int fc_config_to_dict(const fc_key *keys, const void *src, PyObject *into)
{
    for (const fc_key *k = keys; k->name != NULL; k++) {
        if (k->kind == FC_KEY_REMOVED)
            continue;
        const char *p = (const char *)src + k->offset;
        PyObject *v = NULL;
        switch (k->kind) {
        case FC_KEY_BOOL:
            v = PyBool_FromLong(*(const int *)p);
            break;
        case FC_KEY_CHOICE:
            v = PyUnicode_FromString(k->choices[*(const int *)p]);
            break;
        case FC_KEY_INT:
            v = PyLong_FromLongLong(*(const int64_t *)p);
            break;
        case FC_KEY_FLOAT:
            v = PyFloat_FromDouble(*(const double *)p);
            break;
        default:
            break;
        }
        if (v == NULL || PyDict_SetItemString(into, k->name, v) < 0) {
            Py_XDECREF(v);
            return -1;
        }
        Py_DECREF(v);
    }
    return 0;
}

PyObject *fc_keys_info(const fc_key *keys)
{
    static const char *const kinds[] = {"", "bool", "int", "float", "choice"};
    PyObject *list = PyList_New(0);
    if (list == NULL)
        return NULL;
    for (const fc_key *k = keys; k->name != NULL; k++) {
        PyObject *choices = Py_None, *def = NULL, *item = NULL;
        if (k->kind == FC_KEY_REMOVED)
            continue;
        Py_INCREF(Py_None);
        if (k->kind == FC_KEY_CHOICE) {
            Py_DECREF(choices);
            choices = PyList_New(0);
            for (int i = 0; choices != NULL && k->choices[i] != NULL; i++) {
                PyObject *s = PyUnicode_FromString(k->choices[i]);
                if (s == NULL || PyList_Append(choices, s) < 0) {
                    Py_XDECREF(s);
                    Py_CLEAR(choices);
                    break;
                }
                Py_DECREF(s);
            }
            def = choices ? PyUnicode_FromString(k->choices[(int)k->def]) : NULL;
        } else if (k->kind == FC_KEY_BOOL) {
            def = PyBool_FromLong(k->def != 0);
        } else if (k->kind == FC_KEY_INT) {
            def = PyLong_FromLongLong((long long)k->def);
        } else {
            def = PyFloat_FromDouble(k->def);
        }
        if (choices != NULL && def != NULL)
            item = Py_BuildValue("{s:s,s:s,s:O,s:d,s:d,s:O,s:O,s:s,s:O}", "name", k->name, "type",
                                 kinds[k->kind], "default", def, "min", k->lo, "max", k->hi,
                                 "power_of_two", (k->flags & FC_KEY_POW2) ? Py_True : Py_False,
                                 "choices", choices, "doc", k->doc ? k->doc : "", "rank_local",
                                 (k->flags & FC_KEY_LOCAL) ? Py_True : Py_False);
        Py_XDECREF(def);
        Py_XDECREF(choices);
        if (item == NULL || PyList_Append(list, item) < 0) {
            Py_XDECREF(item);
            Py_DECREF(list);
            return NULL;
        }
        Py_DECREF(item);
    }
    return list;
}
