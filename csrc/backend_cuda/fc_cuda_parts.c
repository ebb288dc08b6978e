/* fc_cuda_parts.c: the host side of a parts method on CUDA (adaptive): each chunk's spans as
 * m_adaptive.c walks them (fc_adaptive_spans, so the sub-chunks are the CPU's: the rung's config,
 * the span's length, its streams' key0 mixed with the part index), listed for the library, which
 * runs each through its rung's kernels and puts the bodies where the CPU's encode puts them. */
#include "backend_cuda/fc_cuda_parts.h"

#include <stdlib.h>
#include <string.h>

#include "driver/fc_core_impl.h"
#include "methods/fc_adaptive.h"

/* The host's list grown to hold `need` spans (kept from call to call, freed with the State). */
static int room(fc_cuda_host *h, int64_t need, fc_err *err)
{
    if (h->parts_cap >= need)
        return FC_OK;
    fc_cuda_part *p = (fc_cuda_part *)realloc(h->parts, (size_t)need * sizeof(fc_cuda_part));
    if (p == NULL)
        return fc_fail(err, FC_ERR_NOMEM, "could not allocate %lld CUDA part records",
                       (long long)need);
    h->parts = p;
    h->parts_cap = need;
    return FC_OK;
}

/* Appends chunk c's spans (as chunk `chunk` of the call's geometry) at h->parts[*count]. */
static int add_chunk(fc_cuda_host *h, const fc_chunk *c, int chunk, int64_t *count, fc_err *err)
{
    const int64_t k = fc_adaptive_spans(c, NULL, 0);
    fc_adaptive_span *sp = (fc_adaptive_span *)malloc((size_t)(k > 0 ? k : 1) * sizeof(*sp));
    int rc = sp == NULL ? fc_fail(err, FC_ERR_NOMEM, "could not allocate %lld spans", (long long)k)
                        : room(h, *count + k, err);
    if (rc == FC_OK) {
        fc_adaptive_spans(c, sp, k);
        for (int64_t i = 0; i < k; i++) {
            fc_cuda_part *p = &h->parts[*count + i];
            memset(p, 0, sizeof(*p));
            p->m.id = sp[i].m->id;
            memcpy(p->m.cfg, sp[i].cfg, sp[i].m->cfg_size);
            p->chunk = chunk;
            p->lo = sp[i].lo;
            p->n = sp[i].n;
            p->at = sp[i].at;
            p->bytes = sp[i].bytes;
            p->mix = sp[i].mix;
        }
        *count += k;
    }
    free(sp);
    return rc;
}

/* The call's list and the headers' fingerprint (every chunk of a unit has its table). */
static void set_head(const fc_core *s, const fc_cuda_call *k, const fc_method *m, const fc_chunk *c,
                     int64_t count, fc_cuda_head *h)
{
    h->x.parts = k->host->parts;
    h->x.n_parts = count;
    h->fingerprint = fc_core_header_key(s, m, c).fingerprint;
}

int fc_cuda_parts_unit(const fc_core *s, const fc_cuda_call *k, const fc_method *m, int64_t numel,
                       int dtype, int world, int rank, uint32_t unit, int decode, fc_cuda_head *h,
                       fc_err *err)
{
    int64_t count = 0;
    fc_chunk last;
    if (!(m->flags & FC_PARTS))
        return FC_OK;
    memset(&last, 0, sizeof(last));
    /* a list, even of no span: the library's sign of a parts call */
    int rc = room(k->host, 1, err);
    for (int c = 0; rc == FC_OK && c < world; c++) {
        int64_t start, n;
        fc_chunk_span(numel, world, c, &start, &n);
        if (decode ? c != rank : !fc_core_has_payload(s, numel, world, rank, c))
            continue;
        /* a decode's spans are the own chunk's, which every sender's payload carries */
        last = fc_core_make_chunk(s, m, n, world, dtype, unit, (uint32_t)c, decode ? 0 : rank);
        if (n > 0)
            rc = add_chunk(k->host, &last, c, &count, err);
    }
    if (rc == FC_OK)
        set_head(s, k, m, &last, count, h);
    return rc;
}

int fc_cuda_parts_single(const fc_core *s, const fc_cuda_call *k, int64_t n, int world, int rank,
                         uint32_t unit, uint32_t chunk, fc_cuda_head *h, fc_err *err)
{
    int64_t count = 0;
    if (!(s->method->flags & FC_PARTS))
        return FC_OK;
    const fc_chunk c = fc_core_make_chunk(s, s->method, n, world, FC_F32, unit, chunk, rank);
    int rc = room(k->host, 1, err);
    if (rc == FC_OK && n > 0)
        rc = add_chunk(k->host, &c, 0, &count, err);
    if (rc == FC_OK)
        set_head(s, k, s->method, &c, count, h);
    return rc;
}
