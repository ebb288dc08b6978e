// emu_main.cpp (tests only): runs the CUDA library's encode or decode (fc_cuda_get_api, the real
// driver and kernels of cuda/, built against the host emulation in cuda_runtime.h) on buffers
// in a directory, for tests/cuda/test_cuda_emulated.py; and the codecs of fc_cu_codecs.cuh alone on
// an fp32 array, as a sparsifier's value codec uses them.
//   emu encode DIR: args.txt, grad.bin [, res.bin] -> send.bin [, res.bin rewritten], ws.bin
//   emu decode DIR: args.txt, recv.bin, grad.bin -> out.bin, ws.bin
//   emu compress DIR: args.txt, grad.bin (fp32) -> send.bin (one payload), ws.bin
//   emu decompress DIR: args.txt, recv.bin (one payload), grad.bin (fp32 acc) -> out.bin
//     (acc += alpha * decode), ws.bin
//   emu array DIR: args.txt, x.bin, acc.bin -> body.bin, acc.bin (+= alpha * decode of body)
//   emu methods -: the wire ids of the methods with kernels
// args.txt holds "key value" lines (and "cfg HEX": the method's parsed config struct, fc_cfg.h,
// as State._config_bytes gives it).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "fc_cu_codecs.cuh"

extern "C" const fc_cuda_api *fc_cuda_get_api(int abi);

// CUB is stubbed in emu_stubs.cpp.

static std::vector<uint8_t> slurp(const std::string &path)
{
    std::vector<uint8_t> v;
    FILE *f = fopen(path.c_str(), "rb");
    if (f == NULL) {
        fprintf(stderr, "cannot open %s\n", path.c_str());
        exit(2);
    }
    uint8_t buf[1 << 16];
    size_t k;
    while ((k = fread(buf, 1, sizeof buf, f)) > 0)
        v.insert(v.end(), buf, buf + k);
    fclose(f);
    return v;
}

static void spill(const std::string &path, const void *p, size_t n)
{
    FILE *f = fopen(path.c_str(), "wb");
    if (f == NULL || fwrite(p, 1, n, f) != n) {
        fprintf(stderr, "cannot write %s\n", path.c_str());
        exit(2);
    }
    fclose(f);
}

// ---- the codecs on an array: encode by warps (no residual), decode one element per thread

template <class C>
__global__ void encode_array(const float *x, int64_t n, uint8_t *body, fc_rng rng, C c)
{
    const fc_cu_f32_values v{x};
    fc_cu_no_sink none;
    fc_cu_encode_blocks(c, v, n, body, rng, none, (int64_t)blockIdx.x * FC_CU_CODEC_WARPS + (threadIdx.x >> 5),
                        (int64_t)gridDim.x * FC_CU_CODEC_WARPS);
}

template <class C> __global__ void decode_array(const uint8_t *body, int64_t n, float alpha, float *acc, C c)
{
    const typename C::dec d = c.at(n);
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int bad = 0;
        acc[i] += d.term(body, i, alpha, &bad);
    }
}

template <class C>
static void run_array(const C &c, std::map<std::string, double> &a, const std::vector<uint8_t> &x,
                      std::vector<uint8_t> &acc, std::vector<uint8_t> &body)
{
    const int64_t n = (int64_t)(x.size() / 4);
    const int64_t units = (n + fc_cu_unit(c.bs) - 1) / fc_cu_unit(c.bs);
    fc_rng base;
    base.key0 = (uint32_t)(uint64_t)a["seed"];
    base.key1 = (uint32_t)((uint64_t)a["seed"] >> 32);
    base.unit = (uint32_t)a["unit"];
    base.step = 0;
    const fc_rng rng = fc_cu_chunk_rng(base, (int)a["chunk"], (int)a["rank"]);
    // few blocks, so that warps walk several units each
    fc_emu_launch(encode_array<C>, dim3((unsigned)(units < 2 ? 1 : 2)), dim3(FC_CU_CODEC_THREADS))(
        (const float *)x.data(), n, body.data(), rng, c);
    fc_emu_launch(decode_array<C>, dim3(2), dim3(64))((const uint8_t *)body.data(), n, (float)a["alpha"],
                                                       (float *)acc.data(), c);
}

static void array_mode(const fc_cuda_method_cfg &m, std::map<std::string, double> &a, const std::string &dir)
{
    std::vector<uint8_t> x = slurp(dir + "/x.bin"), acc = slurp(dir + "/acc.bin");
    std::vector<uint8_t> body((size_t)a["body_bytes"], 0xA5);
    if (m.id == 3) {
        const fc_int8_cfg *k = fc_cu_cfg_of<fc_int8_cfg>(&m);
        run_array(fc_cu_int8_codec{k->block_size, k->stochastic}, a, x, acc, body);
    } else if (m.id == 4) {
        const fc_fp8_cfg *k = fc_cu_cfg_of<fc_fp8_cfg>(&m);
        run_array(fc_cu_fp8_codec{k->block_size, k->format}, a, x, acc, body);
    } else if (m.id == 5) {
        const fc_intn_cfg *k = fc_cu_cfg_of<fc_intn_cfg>(&m);
        run_array(fc_cu_intn_codec{k->block_size, (int)k->bits, k->stochastic, k->scheme}, a, x, acc, body);
    } else if (m.id == 6) {
        const fc_qsgd_cfg *k = fc_cu_cfg_of<fc_qsgd_cfg>(&m);
        run_array(fc_cu_qsgd_codec{k->bucket_size, (int32_t)k->levels, fc_qsgd_width(k->levels)}, a, x, acc, body);
    } else if (m.id == 7) {
        run_array(fc_cu_nc_codec{fc_cu_cfg_of<fc_nc_cfg>(&m)->block_size}, a, x, acc, body);
    } else if (m.id == 14) {
        run_array(fc_cu_onebit_codec{fc_cu_cfg_of<fc_onebit_cfg>(&m)->block_size}, a, x, acc, body);
    }
    else
        exit(3);
    spill(dir + "/body.bin", body.data(), body.size());
    spill(dir + "/acc.bin", acc.data(), acc.size());
}

// The call header every mode's arguments start with (fc_cuda_head), from args.txt: what the
// driver's call_head (csrc/backend_cuda/fc_cuda_path.c) fills; the mode sets the rest.
static fc_cuda_head head(const fc_cuda_method_cfg &m, const fc_cuda_geom &g, std::map<std::string, double> &a,
                         std::vector<uint8_t> &grad, std::vector<uint8_t> &ws)
{
    fc_cuda_head h;
    memset(&h, 0, sizeof h);
    h.m = m;
    h.geo = g;
    h.grad = grad.data();
    h.grad_dtype = (int)a["gdt"]; // compress, decompress: 0 (fp32)
    h.unit = (uint32_t)a["unit"];
    h.step = (uint32_t)a["step"];
    h.chunk_base = (uint32_t)a["chunk"]; // compress, decompress: their `chunk`; else 0
    h.seed = (uint64_t)a["seed"];
    h.fingerprint = (uint32_t)a["fingerprint"];
    h.nonfinite_zero = (int)a["nonfinite_zero"];
    h.ws = (fc_cuda_ws *)ws.data();
    return h;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: emu encode|decode|compress|decompress|array DIR | emu methods -\n");
        return 2;
    }
    const std::string mode = argv[1], dir = argv[2];
    if (mode == "methods") { // the wire ids with kernels
        for (int id = 0; id < 256; id++)
            if (fc_cuda_get_api(FC_CUDA_ABI)->has_method(id))
                printf("%d\n", id);
        return 0;
    }
    std::map<std::string, double> a;
    fc_cuda_method_cfg m;
    memset(&m, 0, sizeof m);
    {
        FILE *f = fopen((dir + "/args.txt").c_str(), "r");
        if (f == NULL)
            return 2;
        char key[128], hex[2 * FC_CFG_MAX + 1];
        double v;
        while (fscanf(f, "%127s", key) == 1) {
            if (strcmp(key, "cfg") == 0 && fscanf(f, "%512s", hex) == 1) { // the struct's bytes
                for (size_t i = 0; 2 * i + 1 < strlen(hex) && i < FC_CFG_MAX; i++) {
                    unsigned byte = 0;
                    sscanf(hex + 2 * i, "%2x", &byte);
                    m.cfg[i] = (unsigned char)byte;
                }
            } else if (fscanf(f, "%lf", &v) == 1) {
                a[key] = v;
            }
        }
        fclose(f);
    }
    m.id = (int)a["method"];
    if (mode == "array") {
        array_mode(m, a, dir);
        return 0;
    }
    fc_cuda_geom g;
    memset(&g, 0, sizeof g);
    g.numel = (int64_t)a["numel"];
    g.world = (int)a["world"];
    g.per = a.count("per") ? (int64_t)a["per"] : (g.numel + g.world - 1) / g.world; // per: one chunk
    g.rank = (int)a["rank"];
    g.skip_own = (int)a["skip_own"];
    g.pay_full = (int64_t)a["pay_full"];
    g.body_full = (int64_t)a["body_full"];
    g.pay_last = (int64_t)a["pay_last"];
    g.body_last = (int64_t)a["body_last"];
    const fc_cuda_api *api = fc_cuda_get_api(FC_CUDA_ABI);
    fc_cuda_ctx *ctx = api->ctx_new();
    std::vector<uint8_t> ws(FC_CUDA_WS_BYTES, 0);
    fc_err err;
    memset(&err, 0, sizeof err);
    int rc;
    std::vector<uint8_t> grad = slurp(dir + "/grad.bin");
    fc_cuda_encode_args e;
    fc_cuda_decode_args d;
    memset(&e, 0, sizeof e);
    memset(&d, 0, sizeof d);
    e.h = d.h = head(m, g, a, grad, ws);
    e.ef_decay = a.count("ef_decay") ? (float)a["ef_decay"] : 1.0f; // the driver's: the key as a float
    if (mode == "compress") { // State.compress: geometry of one chunk, chunk_base = `chunk`
        std::vector<uint8_t> send((size_t)a["send_bytes"], 0xA5);
        e.send = send.data();
        int64_t written = 0;
        rc = api->compress(ctx, &e, &written, &err);
        if (rc == FC_OK)
            spill(dir + "/send.bin", send.data(), (size_t)written);
    } else if (mode == "decompress") { // State.decompress: acc (grad.bin) += alpha * D(payload)
        std::vector<uint8_t> recv = slurp(dir + "/recv.bin");
        d.recv = recv.data();
        d.slot = (int64_t)recv.size();
        d.out = grad.data();
        d.out_dtype = 0;
        d.out_numel = g.numel;
        d.alpha = (float)a["alpha"];
        rc = api->decompress(ctx, &d, &err);
        if (rc == FC_OK)
            spill(dir + "/out.bin", grad.data(), grad.size());
    } else if (mode == "encode") {
        std::vector<uint8_t> res;
        if (a["rdt"] >= 0) {
            res = slurp(dir + "/res.bin");
            e.residual = res.data();
            e.res_dtype = (int)a["rdt"];
        }
        std::vector<uint8_t> send((size_t)a["send_bytes"], 0xA5); // unwritten bytes show
        e.send = send.data();
        e.sample = (int)a["sample"];
        rc = api->encode(ctx, &e, &err);
        if (rc == FC_OK) {
            spill(dir + "/send.bin", send.data(), send.size());
            if (!res.empty())
                spill(dir + "/res.bin", res.data(), res.size());
        }
    } else {
        std::vector<uint8_t> recv = slurp(dir + "/recv.bin");
        d.recv = recv.data();
        d.slot = (int64_t)a["slot"];
        d.out_dtype = (int)a["odt"];
        d.out_numel = (int64_t)a["out_numel"];
        std::vector<uint8_t> out((size_t)d.out_numel * (d.out_dtype == 0 ? 4 : 2), 0xA5);
        d.out = out.data();
        rc = api->decode(ctx, &d, &err);
        if (rc == FC_OK)
            spill(dir + "/out.bin", out.data(), out.size());
    }
    api->ctx_free(ctx);
    if (rc != FC_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    spill(dir + "/ws.bin", ws.data(), sizeof(fc_cuda_ws));
    return 0;
}
