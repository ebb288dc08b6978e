/* state_codec.c: the State's compressed reduce-scatter calls: plan, encode/decode (through the
 * driver, fc_drive_*, on the tensors' backend) and the per-peer parts. */
#include "python/state.h" /* first: it includes Python.h */
#include <string.h>

#include "backend_cpu/fc_cpu.h"
#include "common/fc_res8.h"

static int64_t plan_total(const int64_t *splits, int world)
{
    int64_t t = 0;
    for (int r = 0; r < world; r++)
        t += splits[r];
    return t;
}

/* ---------------------------------------------------------------- State: the collective */

FC_DOCSTRING(fc_state_plan_doc,
"plan(grad, world, rank, unit=-1) -> (send_splits, recv_splits)\n\n"
"Payload bytes this rank sends to and receives from each rank for `grad`: the split sizes of\n"
"the all-to-all. A pure function of method, config, size, dtype and world size, and for\n"
"'adaptive' of the unit's parts table (set_parts): it needs `unit`.");

PyObject *fc_state_plan(StateObject *self, PyObject *args)
{
    PyObject *grad, *send = NULL, *recv = NULL;
    int world, rank;
    long long unit = -1;
    fc_err err = {0};
    fc_view g;
    int64_t ss[FC_MAX_WORLD], rs[FC_MAX_WORLD];
    if (!fc_state_ready(self) || !PyArg_ParseTuple(args, "Oii|L:plan", &grad, &world, &rank, &unit))
        return NULL;
    if (fc_check_world(world, rank, &err) != FC_OK || fc_view_get(grad, "grad", FC_DT_FLOATS, &g, &err) != FC_OK)
        return STATE_ERR(self, &err);
    /* a parts table sizes each chunk: the unit's, never a guess */
    if (unit < 0 && (fc_core_unit_method(&self->core, g.buf.numel)->flags & FC_PARTS)) {
        fc_view_release(&g);
        PyErr_Format(PyExc_ValueError, "plan: method '%s' sizes its payloads by the unit's parts "
                     "table: pass the unit, plan(grad, world, rank, unit)", self->core.method->name);
        return NULL;
    }
    if (unit >= 0 && fc_state_check_unit(self, unit, g.buf.numel, &err) != FC_OK) {
        fc_view_release(&g);
        return STATE_ERR(self, &err);
    }
    fc_core_plan(&self->core, g.buf.numel, g.buf.dtype, world, rank, unit, ss, rs);
    fc_view_release(&g);
    send = PyTuple_New(world);
    recv = PyTuple_New(world);
    if (send == NULL || recv == NULL)
        goto error;
    for (int r = 0; r < world; r++) {
        PyObject *a = PyLong_FromLongLong(ss[r]), *b = PyLong_FromLongLong(rs[r]);
        if (a == NULL || b == NULL) {
            Py_XDECREF(a);
            Py_XDECREF(b);
            goto error;
        }
        PyTuple_SetItem(send, r, a);
        PyTuple_SetItem(recv, r, b);
    }
    return Py_BuildValue("(NN)", send, recv);
error:
    Py_XDECREF(send);
    Py_XDECREF(recv);
    return NULL;
}

FC_DOCSTRING(fc_state_encode_doc,
"encode(grad, send, world, rank, unit) -> tuple[int, ...]\n\n"
"Encodes every outgoing chunk of the flat gradient `grad` into the uint8 buffer `send`\n"
"(sized by plan()), applying and updating the unit's error-feedback residual. Returns the\n"
"bytes written for each rank; the payloads lie back to back. For a method whose size is\n"
"data-dependent (flags['varsize']) these are below plan()'s bounds.");

/* What encode() and encode_part() hold: the views of grad and send, and the unit's residual
 * when error feedback applies to it (use_ef). */
typedef struct {
    fc_view g, s;
    fc_res_hold r;
    int use_ef;
} encode_call;

/* What encode() and encode_part() share: grad and send viewed and checked, send as long as
 * plan() says (with `whole`; the C side checks a per-peer buffer against its pieces), and the
 * unit's residual when error feedback applies to it. encode_release() undoes it. */
static int encode_views(StateObject *self, PyObject *grad, PyObject *send, int world, int rank,
                        long long unit, int whole, encode_call *e, fc_err *err)
{
    int64_t ss[FC_MAX_WORLD], rs[FC_MAX_WORLD];
    if (fc_view_get(grad, "grad", FC_DT_FLOATS, &e->g, err) != FC_OK ||
        fc_view_get(send, "send", FC_DT_U8, &e->s, err) != FC_OK ||
        fc_check_same_device(&e->s, &e->g, "send", err) || fc_check_aligned(&e->s, "send", err) ||
        fc_check_world(world, rank, err) || fc_state_check_unit(self, unit, e->g.buf.numel, err))
        return err->code != FC_OK ? err->code : FC_ERR_VALUE;
    fc_core_plan(&self->core, e->g.buf.numel, e->g.buf.dtype, world, rank, unit, ss, rs);
    if (whole && e->s.buf.numel != plan_total(ss, world))
        return fc_fail(err, FC_ERR_VALUE, "send has %lld bytes, plan() needs %lld",
                       (long long)e->s.buf.numel, (long long)plan_total(ss, world));
    e->use_ef = fc_drive_uses_residual(&self->core, e->g.buf.numel, world, e->g.buf.dtype);
    if (e->use_ef && fc_state_residual(self, (uint32_t)unit, FC_SLOT_SCATTER, grad, &e->g, &e->r, err) != FC_OK)
        return err->code != FC_OK ? err->code : FC_ERR_PYTHON;
    return FC_OK;
}

static void encode_release(encode_call *e)
{
    fc_view_release(&e->g);
    fc_view_release(&e->s);
    fc_res_release(&e->r);
}

PyObject *fc_state_encode(StateObject *self, PyObject *args)
{
    PyObject *grad, *send;
    int world, rank, rc = FC_ERR_VALUE; /* until the encode has run */
    long long unit;
    fc_err err = {0};
    encode_call e = {0};
    int64_t sizes[FC_MAX_WORLD];
    if (!fc_state_ready(self) ||
        !PyArg_ParseTuple(args, "OOiiL:encode", &grad, &send, &world, &rank, &unit))
        return NULL;
    fc_cuda_call k;
    fc_exec x;
    if (encode_views(self, grad, send, world, rank, unit, 1, &e, &err) != FC_OK)
        goto error;
    const fc_prep p = {FC_PREP_ENCODE, &e.g.buf, NULL, NULL, world, rank, (uint32_t)unit, 0};
    if (fc_state_exec(self, grad, &e.g, &p, &k, &x, &err) != FC_OK)
        goto error;
    if (e.use_ef)
        (void)fc_res_in_place(self, &x, &e.r, (uint32_t)unit, FC_RES8_SALT_SCATTER);
    if (e.use_ef && fc_res_workspace(self, grad, e.g.buf.numel, &e.r, &err) != FC_OK)
        goto error;
    Py_BEGIN_ALLOW_THREADS
    rc = e.use_ef ? fc_res_unpack(self, &x, &e.r, &err) : FC_OK;
    if (rc == FC_OK)
        rc = fc_drive_encode(&self->core, &x, &e.g.buf, &e.s.buf, e.use_ef ? e.r.buf : NULL, world,
                             rank, (uint32_t)unit, sizes, &err);
    if (rc == FC_OK && e.use_ef)
        rc = fc_res_pack(self, &x, &e.r, (uint32_t)unit, FC_RES8_SALT_SCATTER, &err);
    Py_END_ALLOW_THREADS
error: /* and success: rc says which */
    encode_release(&e);
    return rc == FC_OK ? fc_sizes_tuple(sizes, world) : STATE_ERR(self, &err);
}

FC_DOCSTRING(fc_state_decode_doc,
"decode(recv, grad, out, world, rank, unit)\n\n"
"Sums, in fp32 and in rank order, this rank's exact chunk of `grad` and the payloads in\n"
"`recv`, divides by `world` and writes every element of `out`. A unit with a second round\n"
"(fetch_kmax() > 0) only picks its coordinates here: fetch() and finish() write `out`.");

PyObject *fc_state_decode(StateObject *self, PyObject *args)
{
    fc_out_call c = {0};
    fc_cuda_call k;
    fc_exec x;
    int rc = fc_state_out_call(self, args, "OOOiiL:decode", &c);
    if (rc < 0)
        return NULL;
    if (rc != FC_OK || (rc = fc_view_get(c.data, "recv", FC_DT_U8, &c.v, &c.err)) != FC_OK ||
        (rc = fc_check_same_device(&c.v, &c.g, "recv", &c.err)) != FC_OK ||
        (rc = fc_check_same_device(&c.o, &c.g, "output", &c.err)) != FC_OK ||
        (rc = fc_check_aligned(&c.v, "recv", &c.err)) != FC_OK)
        goto error;
    const uint32_t unit = (uint32_t)c.unit;
    const fc_prep p = {FC_PREP_DECODE, &c.g.buf, &c.v.buf, &c.o.buf, c.world, c.rank, unit, 0};
    if ((rc = fc_state_exec(self, c.grad, &c.g, &p, &k, &x, &c.err)) != FC_OK)
        goto error;
    Py_BEGIN_ALLOW_THREADS
    rc = fc_drive_decode(&self->core, &x, &c.v.buf, &c.g.buf, &c.o.buf, c.world, c.rank, unit,
                         &c.err);
    Py_END_ALLOW_THREADS
error: /* and success: rc says which */
    return fc_state_out_done(self, rc, &c);
}

/* ---------------------------------------------------------------- State: one peer at a time */

FC_DOCSTRING(fc_state_per_peer_ok_doc,
"per_peer_ok(numel, world) -> bool\n\n"
"Whether a unit of `numel` elements can be exchanged one payload at a time with\n"
"encode_part()/decode_part(): fixed-size payloads, no second round, no compressed-domain sum.");

PyObject *fc_state_per_peer_ok(StateObject *self, PyObject *args)
{
    long long numel;
    int world;
    if (!fc_state_ready(self) || !PyArg_ParseTuple(args, "Li:per_peer_ok", &numel, &world))
        return NULL;
    fc_err err = {0};
    if (fc_check_numel(numel, 0, "numel", &err) != FC_OK || fc_check_world(world, 0, &err) != FC_OK)
        return STATE_ERR(self, &err);
    return PyBool_FromLong(fc_core_per_peer_ok(&self->core, (int64_t)numel, world));
}

FC_DOCSTRING(fc_state_pieces_doc,
"pieces(grad, world, rank) -> (send, recv)\n\n"
"The parts of the per-peer exchange: send[c] the byte sizes of the pieces this rank sends for\n"
"chunk c, recv[s] those it receives from rank s, back to back per chunk in the send and\n"
"receive buffers. A chunk without payload (the own one, an empty one) is one part of 0 bytes.");

static PyObject *pieces_tuple(StateObject *self, int64_t numel, int dtype, int world, int rank,
                              int as_sender)
{
    PyObject *t = PyTuple_New(world);
    for (int c = 0; t != NULL && c < world; c++) {
        int64_t sizes[FC_MAX_PIECES];
        int count;
        /* as the sender: chunk c from this rank; as the receiver: this rank's chunk from rank c */
        fc_core_piece_plan(&self->core, numel, dtype, world, as_sender ? rank : c,
                           as_sender ? c : rank, sizes, &count);
        PyObject *p = fc_sizes_tuple(sizes, count);
        if (p == NULL) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SetItem(t, c, p);
    }
    return t;
}

PyObject *fc_state_pieces(StateObject *self, PyObject *args)
{
    PyObject *grad;
    int world, rank;
    fc_err err = {0};
    fc_view g = {0};
    if (!fc_state_ready(self) || !PyArg_ParseTuple(args, "Oii:pieces", &grad, &world, &rank))
        return NULL;
    if (fc_view_get(grad, "grad", FC_DT_FLOATS, &g, &err) != FC_OK ||
        fc_check_world(world, rank, &err) != FC_OK) {
        fc_view_release(&g);
        return STATE_ERR(self, &err);
    }
    const int64_t numel = g.buf.numel;
    const int dtype = g.buf.dtype;
    fc_view_release(&g);
    PyObject *send = pieces_tuple(self, numel, dtype, world, rank, 1);
    PyObject *recv = send == NULL ? NULL : pieces_tuple(self, numel, dtype, world, rank, 0);
    PyObject *out = recv == NULL ? NULL : PyTuple_Pack(2, send, recv);
    Py_XDECREF(send);
    Py_XDECREF(recv);
    return out;
}

FC_DOCSTRING(fc_state_encode_part_doc,
"encode_part(grad, send, world, rank, unit, chunk, piece) -> int\n\n"
"encode() one part at a time: writes piece `piece` of the payload for rank `chunk` into its\n"
"slot of `send` (laid out as pieces() says) and returns its size (0: no payload). Chunks may\n"
"come in any order, a chunk's pieces in order, every part once; the call is counted when its\n"
"last part is done. With one piece per chunk the bytes are encode()'s. CPU tensors.");

PyObject *fc_state_encode_part(StateObject *self, PyObject *args)
{
    PyObject *grad, *send;
    int world, rank, chunk, piece, rc = FC_ERR_VALUE; /* until the encode has run */
    long long unit;
    fc_err err = {0};
    encode_call e = {0};
    int64_t size = 0;
    if (!fc_state_ready(self) ||
        !PyArg_ParseTuple(args, "OOiiLii:encode_part", &grad, &send, &world, &rank, &unit, &chunk,
                          &piece))
        return NULL;
    if (encode_views(self, grad, send, world, rank, unit, 0, &e, &err) != FC_OK ||
        fc_check_cpu(&e.g, "grad", &err))
        goto error;
    const fc_exec x = {&fc_backend_cpu, NULL};
    /* the parts run on the host, which packs an 8-bit residual in place as they write it (a
     * block cut between two parts waits in the core's carry): nothing is held between them */
    if (e.use_ef)
        (void)fc_res_in_place(self, &x, &e.r, (uint32_t)unit, FC_RES8_SALT_SCATTER);
    Py_BEGIN_ALLOW_THREADS
    rc = fc_drive_encode_part(&self->core, &x, &e.g.buf, &e.s.buf, e.use_ef ? e.r.buf : NULL, world,
                              rank, (uint32_t)unit, chunk, piece, &size, &err);
    Py_END_ALLOW_THREADS
error: /* and success: rc says which */
    encode_release(&e);
    return rc == FC_OK ? PyLong_FromLongLong(size) : STATE_ERR(self, &err);
}

FC_DOCSTRING(fc_state_decode_part_doc,
"decode_part(payload, grad, out, world, rank, unit, src, piece)\n\n"
"decode() one part at a time, as they arrive: src = rank first (one empty part unless\n"
"compress_own_chunk), then rank+1, rank+2, ... mod world, each sender's pieces in order. The\n"
"sum runs in that fixed order (for world > 2 it rounds differently from decode()'s rank\n"
"order); the last part writes `out`. CPU tensors.");

PyObject *fc_state_decode_part(StateObject *self, PyObject *args)
{
    fc_out_call c = {0};
    int rc = fc_state_out_call(self, args, "OOOiiLii:decode_part", &c);
    if (rc < 0)
        return NULL;
    /* the parts run on the host only */
    if (rc != FC_OK || (rc = fc_view_get(c.data, "payload", FC_DT_U8, &c.v, &c.err)) != FC_OK ||
        (rc = fc_check_cpu(&c.g, "grad", &c.err)) != FC_OK ||
        (rc = fc_check_cpu(&c.v, "payload", &c.err)) != FC_OK ||
        (rc = fc_check_cpu(&c.o, "output", &c.err)) != FC_OK ||
        (c.v.buf.numel > 0 && (rc = fc_check_aligned(&c.v, "payload", &c.err)) != FC_OK))
        goto error;
    Py_BEGIN_ALLOW_THREADS
    rc = fc_cpu_decode_part(&self->core, &c.v.buf, &c.g.buf, &c.o.buf, c.world, c.rank,
                            (uint32_t)c.unit, c.src, c.piece, &c.err);
    Py_END_ALLOW_THREADS
error: /* and success: rc says which */
    return fc_state_out_done(self, rc, &c);
}
