// Kernel benchmark implementation (see kernel_bench.h).
#include "ops/bench/kernel_bench.h"

#include <sys/resource.h>
#include <unistd.h>
#include <dnnl.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/cpu_set.h"
#include "core/huge_alloc.h"
#include "core/rng.h"
#include "core/thread_pool.h"
#include "ops/cache_pack.h"
#include "ops/kernels.h"
#include "ops/select.h"

namespace dsv41::ops {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Busy jiffies of all CPUs (user+nice+system+irq+softirq+steal) from /proc/stat.
double busy_cpu_seconds() {
  std::ifstream f("/proc/stat");
  std::string cpu;
  uint64_t v[8] = {};
  f >> cpu >> v[0] >> v[1] >> v[2] >> v[3] >> v[4] >> v[5] >> v[6] >> v[7];
  const double hz = static_cast<double>(::sysconf(_SC_CLK_TCK));
  return static_cast<double>(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / hz;
}
double own_cpu_seconds() {
  rusage r{};
  getrusage(RUSAGE_SELF, &r);
  return double(r.ru_utime.tv_sec + r.ru_stime.tv_sec) +
         double(r.ru_utime.tv_usec + r.ru_stime.tv_usec) / 1e6;
}

// Best-of-reps time of fn(), which does `work` once.
double best_time(int reps, const std::function<void()>& fn) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    fn();
    best = std::min(best, seconds_since(t0));
  }
  return best;
}

// oneDNN matmul [m, k] x [k, n] -> f32 (prefill shapes), GFLOP/s: bf16 inputs where the CPU has a
// bf16 path (oneDNN 2.6 needs AVX-512), otherwise f32 inputs, said in "op".
json onednn_matmul_json(int64_t m, int64_t n, int64_t kdim, int reps) {
  using namespace dnnl;
  const auto* v = dnnl_version();
  json j = {{"library", "oneDNN"},
            {"version", std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
                            std::to_string(v->patch)},
            {"m", m},
            {"n", n},
            {"k", kdim}};
  for (auto dt : {memory::data_type::bf16, memory::data_type::f32}) {
    const bool bf16 = dt == memory::data_type::bf16;
    try {
      engine eng(engine::kind::cpu, 0);
      stream st(eng);
      memory::desc a({m, kdim}, dt, memory::format_tag::ab);
      memory::desc b({kdim, n}, dt, memory::format_tag::any);
      memory::desc c({m, n}, memory::data_type::f32, memory::format_tag::ab);
      matmul::primitive_desc pd(matmul::desc(a, b, c), eng);  // oneDNN 2.x API
      memory am(a, eng), bm_plain({{kdim, n}, dt, memory::format_tag::ab}, eng), cm(c, eng),
          bm(pd.weights_desc(), eng);
      const std::size_t esz = bf16 ? 2 : 4;
      std::memset(am.get_data_handle(), 0x3F, std::size_t(m * kdim) * esz);  // any finite values
      std::memset(bm_plain.get_data_handle(), 0x3E, std::size_t(kdim * n) * esz);
      reorder(bm_plain, bm).execute(st, bm_plain, bm);
      matmul mm(pd);
      auto once = [&] {
        mm.execute(st, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
        st.wait();
      };
      once();
      const double t = best_time(reps, once);
      j["op"] =
          bf16 ? "matmul bf16 x bf16 -> f32" : "matmul f32 x f32 -> f32 (no bf16 path on this CPU)";
      j["ms"] = t * 1e3;
      j["gflop_per_s"] = 2.0 * double(m) * double(n) * double(kdim) / t / 1e9;
      return j;
    } catch (const std::exception& e) {
      j[bf16 ? "bf16_error" : "f32_error"] = e.what();
    }
  }
  return j;
}

// Enough copies of one matrix's weights and scales (E4M3 without NaN codes, or random MXFP4
// nibbles; every scale 2^-7) that cycling through them reads from memory, not from a cache.
struct WeightCopies {
  std::vector<HugeVector<uint8_t>> w, s;  // on huge pages, as the engine's weights
  std::size_t bytes = 0;                  // one copy's weights and scales
};
WeightCopies weight_copies(bool fp8, int64_t rows, int64_t in, std::size_t min_set_mb) {
  WeightCopies wc;
  const std::size_t wbytes = std::size_t(fp8 ? rows * in : rows * in / 2),
                    sbytes =
                        std::size_t(fp8 ? (rows + 31) / 32 * ((in + 31) / 32) : rows * in / 32);
  wc.bytes = wbytes + sbytes;
  const std::size_t copies = std::max<std::size_t>(1, (min_set_mb << 20) / wc.bytes);
  wc.w.resize(copies);
  wc.s.resize(copies);
  Rng rng(fp8 ? 1 : 2);
  for (std::size_t c = 0; c < copies; ++c) {
    wc.w[c].resize(wbytes);
    for (auto& b : wc.w[c]) b = fp8 ? uint8_t(rng.below(0x7E)) : uint8_t(rng.next_u64());
    wc.s[c].assign(sbytes, 120);
  }
  return wc;
}

class Bench {
 public:
  explicit Bench(const KernelBenchOptions& o)
      : opt_(o), pool_(o.threads ? o.threads : default_thread_count()), k_(&kernels()) {
    probe_.resize(o.probe_mb << 18);  // floats
    for (std::size_t i = 0; i < probe_.size(); ++i) probe_[i] = float(i & 1023);
  }

  // Read bandwidth (GB/s) over the probe buffer on all threads.
  double probe() {
    const std::size_t n = probe_.size();
    std::vector<float> sink(pool_.size());
    const double t = best_time(opt_.reps, [&] {
      pool_.parallel_for(n, [&](std::size_t b, std::size_t e, std::size_t p) {
        sink[p] += kernels().read_sum(probe_.data() + b, int64_t(e - b));
      });
    });
    return double(n * 4) / t / 1e9;
  }

  // One decode GEMV case: `matrix_bytes` weight bytes per matrix of weight_rows rows (the flops;
  // out is the rows the threads split: gate/up pairs count once); run(copy, ntok, row range)
  // does the rows [r0, r1) of copy `c`.
  json gemv_case(const std::string& name, int64_t out, int64_t in, int64_t weight_rows,
                 std::size_t matrix_bytes, int64_t row_align,
                 const std::function<void(std::size_t, int64_t, int64_t, int64_t, float*)>& run,
                 std::size_t copies, bool one_token_only = false) {
    json j;
    j["kernel"] = name;
    j["shape"] = {out, in};
    j["weight_mb_per_matrix"] = double(matrix_bytes) / 1e6;
    j["copies"] = copies;
    double t1 = 0;
    for (int64_t ntok : {1, 2, 6, 16}) {
      if (one_token_only && ntok != 1) break;
      const double probe_gbs = probe();
      const int64_t blocks = (out + row_align - 1) / row_align;
      std::vector<std::vector<float>> ys(pool_.size(), std::vector<float>(std::size_t(out * ntok)));
      const double t =
          best_time(opt_.reps,
                    [&] {
                      for (std::size_t c = 0; c < copies; ++c)
                        pool_.parallel_for(
                            std::size_t(blocks), [&](std::size_t b, std::size_t e, std::size_t p) {
                              run(c, ntok, int64_t(b) * row_align,
                                  std::min(out, int64_t(e) * row_align), ys[p].data());
                            });
                    }) /
          double(copies);
      const double gbs = double(matrix_bytes) / t / 1e9;
      json r = {{"tokens", ntok},
                {"us_per_matrix", t * 1e6},
                {"weight_gb_per_s", gbs},
                {"gflop_per_s", 2.0 * double(weight_rows) * double(in) * double(ntok) / t / 1e9},
                {"read_probe_gb_per_s", probe_gbs},
                {"fraction_of_read_bandwidth", gbs / probe_gbs}};
      if (ntok == 1) t1 = t;
      if (ntok > 1) r["cost_vs_1_token"] = t / t1;
      j["runs"].push_back(r);
    }
    return j;
  }

  json fp8(const std::string& name, int64_t out, int64_t in) {
    const WeightCopies m = weight_copies(true, out, in, opt_.min_set_mb);
    const int64_t sin = (in + 31) / 32;
    std::vector<float> x(std::size_t(16 * in), 0.5f);
    return gemv_case(
        name, out, in, out, m.bytes, 32,
        [&](std::size_t c, int64_t ntok, int64_t r0, int64_t r1, float* y) {
          const uint8_t *wc = m.w[c].data() + r0 * in, *sc = m.s[c].data() + (r0 / 32) * sin;
          if (ntok == 1)
            k_->fp8_gemv(wc, sc, r1 - r0, in, x.data(), 1, y);
          else
            k_->fp8_gemv_batch(wc, sc, r1 - r0, in, x.data(), ntok, y, r1 - r0);
        },
        m.w.size());
  }

  // The act-quant GEMM (aq_fp8_gemm) on the FP8 shapes, or with `f32` the GEMM for fp32
  // activations (f32_fp8_gemm, act-quant off's): every token count through the one kernel (the
  // activations packed once per call outside the timing, as the engine does before splitting the
  // rows).
  json fp8_aq(const std::string& name, int64_t out, int64_t in, bool f32 = false) {
    const WeightCopies m = weight_copies(true, out, in, opt_.min_set_mb);
    const int64_t sin = (in + 31) / 32;
    std::vector<float> x(std::size_t(16 * in), 0.5f);
    std::vector<uint16_t> xp;
    std::vector<float> xf;
    if (f32) {
      xf.resize(std::size_t(16 * k_->f32_act_stride(in, AqFormat::kFp8)));
      k_->f32_pack_act(x.data(), 16, in, AqFormat::kFp8, xf.data());
    } else {
      xp.resize(std::size_t(16 * k_->aq_act_stride(in, AqFormat::kFp8)));
      k_->aq_pack_act(x.data(), 16, in, AqFormat::kFp8, xp.data());
    }
    return gemv_case(
        name, out, in, out, m.bytes, 32,
        [&](std::size_t c, int64_t ntok, int64_t r0, int64_t r1, float* y) {
          const uint8_t *wc = m.w[c].data() + r0 * in, *sc = m.s[c].data() + (r0 / 32) * sin;
          if (f32)
            k_->f32_fp8_gemm(wc, sc, r1 - r0, in, xf.data(), ntok, y, r1 - r0);
          else
            k_->aq_fp8_gemm(wc, sc, r1 - r0, in, xp.data(), ntok, y, r1 - r0);
        },
        m.w.size());
  }

  // The act-quant MXFP4 entries (aq_mxfp4_gate_up / aq_mxfp4_gemm), or with `f32` those for fp32
  // activations (f32_mxfp4_*), on an expert's shapes.
  json mxfp4_aq(const std::string& name, int64_t out, int64_t in, bool gate_up, bool f32 = false) {
    const int64_t rows = gate_up ? 2 * out : out;
    const WeightCopies m = weight_copies(false, rows, in, opt_.min_set_mb);
    std::vector<float> x(std::size_t(16 * in), 0.5f), route(16, 0.3f);
    std::vector<uint16_t> xp;
    std::vector<float> xf;
    if (f32) {
      xf.resize(std::size_t(16 * k_->f32_act_stride(in, AqFormat::kMxfp4)));
      k_->f32_pack_act(x.data(), 16, in, AqFormat::kMxfp4, xf.data());
    } else {
      xp.resize(std::size_t(16 * k_->aq_act_stride(in, AqFormat::kMxfp4)));
      k_->aq_pack_act(x.data(), 16, in, AqFormat::kMxfp4, xp.data());
    }
    return gemv_case(
        name, out, in, rows, m.bytes, 32,
        [&](std::size_t c, int64_t ntok, int64_t r0, int64_t r1, float* y) {
          const int64_t f = gate_up ? 2 : 1;  // gate/up: out pairs of rows
          const uint8_t *wc = m.w[c].data() + f * r0 * (in / 2),
                        *sc = m.s[c].data() + f * r0 * (in / 32);
          if (f32 && gate_up)
            k_->f32_mxfp4_gate_up(wc, sc, r1 - r0, in, xf.data(), route.data(), ntok, 10.0f, y,
                                  r1 - r0);
          else if (f32)
            k_->f32_mxfp4_gemm(wc, sc, r1 - r0, in, xf.data(), ntok, y, r1 - r0);
          else if (gate_up)
            k_->aq_mxfp4_gate_up(wc, sc, r1 - r0, in, xp.data(), route.data(), ntok, 10.0f, y,
                                 r1 - r0);
          else
            k_->aq_mxfp4_gemm(wc, sc, r1 - r0, in, xp.data(), ntok, y, r1 - r0);
        },
        m.w.size());
  }

  json mxfp4(const std::string& name, int64_t out, int64_t in, bool gate_up,
             bool one_token_only = false) {
    const int64_t rows = gate_up ? 2 * out : out;
    const WeightCopies m = weight_copies(false, rows, in, opt_.min_set_mb);
    std::vector<float> x(std::size_t(16 * in), 0.5f), route(16, 0.3f);
    return gemv_case(
        name, out, in, rows, m.bytes, 32,
        [&](std::size_t c, int64_t ntok, int64_t r0, int64_t r1, float* y) {
          if (gate_up) {
            const uint8_t *wc = m.w[c].data() + 2 * r0 * (in / 2),
                          *sc = m.s[c].data() + 2 * r0 * (in / 32);
            if (ntok == 1)
              k_->mxfp4_gate_up_f32(wc, sc, r1 - r0, in, x.data(), route.data(), 1, 10.0f, y);
            else
              k_->mxfp4_gate_up_batch(wc, sc, r1 - r0, in, x.data(), route.data(), ntok, 10.0f, y,
                                      r1 - r0);
          } else {
            const uint8_t *wc = m.w[c].data() + r0 * (in / 2), *sc = m.s[c].data() + r0 * (in / 32);
            if (ntok == 1)
              k_->mxfp4_gemv_f32(wc, sc, r1 - r0, in, x.data(), 1, y);
            else
              k_->mxfp4_gemv_batch(wc, sc, r1 - r0, in, x.data(), ntok, y, r1 - r0);
          }
        },
        m.w.size(), one_token_only);
  }

  json onednn_matmul(int64_t m, int64_t n, int64_t kdim) {
    return onednn_matmul_json(m, n, kdim, opt_.reps);
  }

  // Our prefill GEMM of one weight format ("fp8", "bf16", "mxfp4") at [m tokens, k] x [n, k]^T,
  // all threads splitting the rows in blocks of 96 (a multiple of the FP8 scale blocks' 32).
  json our_gemm(const std::string& format, int64_t m, int64_t n, int64_t kdim) {
    Rng rng(4);
    std::vector<uint8_t> w8, s8;
    std::vector<uint16_t> w16;
    if (format == "fp8" || format == "fp8_aq") {
      w8.resize(std::size_t(n * kdim));
      for (auto& b : w8) b = uint8_t(rng.below(0x7E));
      s8.assign(std::size_t((n + 31) / 32 * ((kdim + 31) / 32)), 120);
    } else if (format == "mxfp4") {
      w8.resize(std::size_t(n * kdim / 2));
      for (auto& b : w8) b = uint8_t(rng.next_u64());
      s8.assign(std::size_t(n * kdim / 32), 120);
    } else {
      w16.resize(std::size_t(n * kdim));
      for (auto& b : w16) b = uint16_t(0x3C00 + rng.below(0x400));  // finite bf16
    }
    std::vector<float> x(std::size_t(m * kdim)), y(std::size_t(m * n));
    for (auto& v : x) v = float(rng.below(1000)) / 1000.0f - 0.5f;
    const int64_t sin = (kdim + 31) / 32;
    std::vector<uint16_t> xp;
    if (format == "fp8_aq") {
      for (int64_t t = 0; t < m; ++t)  // E4M3 values with a power-of-two scale, as act-quant
        for (int64_t i = 0; i < kdim; ++i)
          x[std::size_t(t * kdim + i)] = float(int(rng.below(15)) - 7) * 0.0625f;
      xp.resize(std::size_t(m * k_->aq_act_stride(kdim, AqFormat::kFp8)) + 32);
    }
    // packed rows on 64-byte lines, as the engine keeps them (a split load per vector otherwise)
    uint16_t* xpa =
        reinterpret_cast<uint16_t*>((reinterpret_cast<uintptr_t>(xp.data()) + 63) & ~uintptr_t(63));
    auto once = [&] {
      if (format == "fp8_aq")
        k_->aq_pack_act(x.data(), m, kdim, AqFormat::kFp8, xpa);  // once per call
      pool_.parallel_for(
          std::size_t((n + 95) / 96), [&](std::size_t b, std::size_t e, std::size_t) {
            const int64_t r0 = int64_t(b) * 96, rows = std::min(n, int64_t(e) * 96) - r0;
            if (format == "fp8_aq")
              k_->aq_fp8_gemm(w8.data() + r0 * kdim, s8.data() + (r0 / 32) * sin, rows, kdim, xpa,
                              m, y.data() + r0, n);
            else if (format == "fp8")
              k_->fp8_gemm(w8.data() + r0 * kdim, s8.data() + (r0 / 32) * sin, rows, kdim, x.data(),
                           m, y.data() + r0, n);
            else if (format == "mxfp4")
              k_->mxfp4_gemm(w8.data() + r0 * (kdim / 2), s8.data() + r0 * (kdim / 32), rows, kdim,
                             x.data(), m, y.data() + r0, n);
            else
              k_->bf16_gemm(w16.data() + r0 * kdim, rows, kdim, x.data(), m, y.data() + r0, n);
          });
    };
    once();
    const double t = best_time(opt_.reps, once);
    return {{"weights", format},
            {"m", m},
            {"n", n},
            {"k", kdim},
            {"ms", t * 1e3},
            {"gflop_per_s", 2.0 * double(m * n) * double(kdim) / t / 1e9}};
  }

  std::size_t threads() const { return pool_.size(); }
  // Run the following cases on tier t (A/B runs); kernels() is the default.
  void use(const Kernels& t) { k_ = &t; }

 private:
  KernelBenchOptions opt_;
  ThreadPool pool_;
  const Kernels* k_;  // the tier the kernels run on (the probe always uses the active one)
  HugeVector<float> probe_;
};

// mHC: the Sinkhorn epilogue against the plain loop, and the whole step at the real shape.
void bench_mhc(const KernelBenchOptions& opt, json& j) {
  // mHC coefficients per token (hc = 4): the tier's kernel against the plain reference loop.
  const float m[24] = {0.1f, -0.2f, 0.3f,  0.05f, 0.4f, -0.1f, 0.2f, 0.0f,
                       0.3f, 0.1f,  -0.3f, 0.2f,  0.5f, 0.1f,  0.0f, -0.4f,
                       0.2f, 0.3f,  -0.1f, 0.1f,  0.0f, 0.2f,  0.4f, -0.2f};
  const float base[24] = {}, scale[3] = {1.0f, 1.0f, 1.0f};
  float pre[4], post[4], comb[16];
  auto per_call_ns = [&](auto fn) {
    constexpr int kCalls = 20000;
    return best_time(opt.reps,
                     [&] {
                       for (int i = 0; i < kCalls; ++i)
                         fn(m, base, scale, 4, 1e-6f, 20, pre, post, comb);
                     }) /
           kCalls * 1e9;
  };
  j["mhc_sinkhorn"] = {{"hc", 4},
                       {"iterations", 20},
                       {"ns_per_token_kernel", per_call_ns(kernels().hc_sinkhorn)},
                       {"ns_per_token_reference_loop", per_call_ns(hc_sinkhorn_ref)}};
  // The whole mHC step of one token at the real shape (hc 4 x 5120): coefficients (the
  // 24 x 20480 F32 GEMV, 1.97 MB, + rms + Sinkhorn), collapse + RMSNorm, expand; one thread,
  // against the scalar tier.
  const int64_t hc = 4, d = 5120, n = hc * d, mix = (2 + hc) * hc;
  std::vector<float> h(static_cast<std::size_t>(n)), fn(static_cast<std::size_t>(mix * n)),
      nw(static_cast<std::size_t>(d), 1.0f), x(static_cast<std::size_t>(d)),
      outh(static_cast<std::size_t>(n));
  Rng rng(5);
  for (auto& v : h) v = float(rng.uniform(-1, 1));
  for (auto& v : fn) v = float(rng.uniform(-0.01, 0.01));
  const float wts[4] = {0.5f, 0.6f, 0.7f, 0.8f};
  auto timed_us = [&](const Kernels& t, int which) {
    return best_time(opt.reps,
                     [&] {
                       for (int i = 0; i < 10; ++i) {
                         if (which == 0)
                           t.hc_mix(h.data(), hc, d, fn.data(), base, m, 1e-6f, 1e-6f, 20, pre,
                                    post, comb);
                         else if (which == 1)
                           t.hc_collapse_rmsnorm(h.data(), wts, hc, d, nw.data(), 1e-6f, x.data());
                         else
                           t.hc_expand(x.data(), h.data(), wts, comb, hc, d, outh.data());
                       }
                     }) /
           10 * 1e6;
  };
  const Kernels& sc = kernels_for(Isa::kScalar);
  j["mhc_step"] = {
      {"hc", hc},
      {"dim", d},
      {"mix_us", timed_us(kernels(), 0)},
      {"mix_us_scalar_tier", timed_us(sc, 0)},
      {"mix_fn_gb_per_s_warm_cache", double(mix * n * 4) / (timed_us(kernels(), 0) * 1e3)},
      {"collapse_rmsnorm_us", timed_us(kernels(), 1)},
      {"collapse_rmsnorm_us_scalar_tier", timed_us(sc, 1)},
      {"expand_us", timed_us(kernels(), 2)},
      {"expand_us_scalar_tier", timed_us(sc, 2)}};
}

// Indexer scoring on tier t: one query against many keys on all threads.
json indexer_case(const KernelBenchOptions& opt, const Kernels& t) {
  // Indexer scoring (32 heads x 128, packed FP4 keys of 68 B): one query against many keys, as in
  // decode with a long context; all threads split the keys.
  const int64_t nh = 32, di = 128, row = index_key_bytes(di);
  const int64_t nkeys = opt.quick ? 4096 : 262144;
  std::vector<uint8_t> q(static_cast<std::size_t>(nh * row)),
      keys(static_cast<std::size_t>(nkeys * row));
  Rng rng(3);
  for (auto& x : q) x = uint8_t(rng.next_u64());
  for (auto& x : keys) x = uint8_t(rng.next_u64());
  for (int64_t key = 0; key < nkeys; ++key)  // valid scales
    for (int64_t blk = 0; blk < di / 32; ++blk)
      keys[static_cast<std::size_t>(key * row + di / 2 + blk)] = 120;
  for (int64_t h = 0; h < nh; ++h)
    for (int64_t blk = 0; blk < di / 32; ++blk)
      q[static_cast<std::size_t>(h * row + di / 2 + blk)] = 127;
  std::vector<float> w(static_cast<std::size_t>(nh), 0.1f), scores(static_cast<std::size_t>(nkeys));
  ThreadPool pool(opt.threads ? opt.threads : default_thread_count());
  const double sec = best_time(opt.reps, [&] {
    pool.parallel_for(static_cast<std::size_t>(nkeys), [&](std::size_t lo, std::size_t hi,
                                                           std::size_t) {
      t.indexer_scores(q.data(), w.data(), nh, di, keys.data() + lo * static_cast<std::size_t>(row),
                       int64_t(hi - lo), scores.data() + lo);
    });
  });
  return {{"heads", nh},
          {"head_dim", di},
          {"keys", nkeys},
          {"ms", sec * 1e3},
          {"keys_per_s", double(nkeys) / sec},
          {"key_gb_per_s", double(nkeys * row) / sec / 1e9}};
}

// The tiers as a switchable speed-up, A/B in the same run (design.md §8): the active tier against
// the tier below it on two kernels the avx512_vnni tier changes (the one-token MXFP4 gate/up as the
// engine calls it: mxfp4_gate_up_f32, the two-term dots; the indexer's dots); with avx2 active that
// is avx2 against scalar. (Until session 13 the gate/up here was the int16 entry, mxfp4_gate_up.)
void bench_tier_ab(Bench& b, const KernelBenchOptions& opt, json& j) {
  const Isa a = active_isa();
  if (a == Isa::kScalar) {
    j["tier_ab"] = "not measured: the scalar tier is active";
    return;
  }
  const Isa below = static_cast<Isa>(static_cast<int>(a) - 1);
  const int64_t inter = opt.quick ? 256 : 2304, dim = opt.quick ? 1024 : 5120;
  double us[2], keys_per_s[2];
  for (int side = 0; side < 2; ++side) {
    const Kernels& t = kernels_for(side == 0 ? a : below);
    b.use(t);
    const json g = b.mxfp4("mxfp4_gate_up expert w13", inter, dim, true, true);
    us[side] = g["runs"][0]["us_per_matrix"].get<double>();
    keys_per_s[side] = indexer_case(opt, t)["keys_per_s"].get<double>();
  }
  b.use(kernels());
  j["tier_ab"] = {{"a", isa_name(a)},
                  {"b", isa_name(below)},
                  {"mxfp4_gate_up_entry", "mxfp4_gate_up_f32 (two-term, the engine's default)"},
                  {"mxfp4_gate_up_1_token_us", {us[0], us[1]}},
                  {"mxfp4_gate_up_1_token_speedup_a_over_b", us[1] / us[0]},
                  {"indexer_keys_per_s", {keys_per_s[0], keys_per_s[1]}},
                  {"indexer_speedup_a_over_b", keys_per_s[0] / keys_per_s[1]}};
}

// Sparse attention of one decode query, and the banded prefill variant.
void bench_attention(const KernelBenchOptions& opt, json& j) {
  // Decode attention of one token: 64 heads x 512 over the window (128 FP8 rows) and the top-k
  // (512 FP4 compressed rows), single thread (one token's heads share the rows).
  const int64_t heads = 64, dim = 512, nwin = 128, ncomp = opt.quick ? 64 : 512;
  std::vector<std::vector<uint8_t>> packed;
  std::vector<const uint8_t*> rows;
  std::vector<uint8_t> kinds;
  std::vector<float> v(static_cast<std::size_t>(dim));
  Rng rng(4);
  for (int64_t r = 0; r < nwin + ncomp; ++r) {
    const uint8_t kind = r < nwin ? 0 : 1;
    for (auto& x : v) x = float(rng.uniform(-1, 1));
    packed.emplace_back(
        static_cast<std::size_t>(kind ? compressed_row_bytes(dim) : window_row_bytes(dim)));
    if (kind)
      pack_compressed_row(v.data(), dim, packed.back().data());
    else
      pack_window_row(v.data(), dim, packed.back().data());
    kinds.push_back(kind);
  }
  for (const auto& p : packed) rows.push_back(p.data());
  std::vector<float> q(static_cast<std::size_t>(heads * dim), 0.01f),
      sink(static_cast<std::size_t>(heads), 0.0f), out(static_cast<std::size_t>(heads * dim));
  auto run = [&](const Kernels& tier) {
    return best_time(opt.reps, [&] {
      tier.sparse_attention(q.data(), heads, dim, rows.data(), kinds.data(), int64_t(rows.size()),
                            0.04f, sink.data(), out.data());
    });
  };
  const double t = run(kernels()), t_ref = run(kernels_for(Isa::kScalar));
  j["sparse_attention"] = {
      {"heads", heads},
      {"dim", dim},
      {"window_rows", nwin},
      {"compressed_rows", ncomp},
      {"us_per_token", t * 1e6},
      {"us_per_token_scalar_reference", t_ref * 1e6},
      {"gflop_per_s", 4.0 * double(heads * dim) * double(rows.size()) / t / 1e9}};

  // Prefill: 16 consecutive queries (positions 1000..1015), each over its 128-row band of a
  // contiguous window and the same compressed rows, single thread; against 16 one-query calls.
  const int64_t nq = 16, p0 = 1000, wpos0 = p0 - nwin + 1, nwrows = nwin + nq - 1;
  const int64_t wb = window_row_bytes(dim);
  std::vector<uint8_t> win(static_cast<std::size_t>(nwrows * wb));
  for (int64_t r = 0; r < nwrows; ++r)
    std::memcpy(win.data() + r * wb, packed[std::size_t(r % nwin)].data(), std::size_t(wb));
  std::vector<const uint8_t*> comp;
  std::vector<int64_t> cofs = {0};
  for (int64_t i = 0; i < nq; ++i) {
    for (int64_t c = 0; c < ncomp; ++c) comp.push_back(rows[std::size_t(nwin + c)]);
    cofs.push_back(cofs.back() + ncomp);
  }
  std::vector<float> qs(static_cast<std::size_t>(nq * heads * dim), 0.01f), outs(qs.size());
  const double tp = best_time(opt.reps, [&] {
    kernels().prefill_attention(qs.data(), nq, heads, dim, win.data(), wpos0, nwrows, p0, nwin,
                                comp.data(), cofs.data(), 0.04f, sink.data(), outs.data());
  });
  const double t1 = best_time(opt.reps, [&] {
    for (int64_t i = 0; i < nq; ++i) {
      std::vector<const uint8_t*> list;
      for (int64_t pos = p0 + i - nwin + 1; pos <= p0 + i; ++pos)
        list.push_back(win.data() + (pos - wpos0) * wb);
      for (int64_t c = 0; c < ncomp; ++c) list.push_back(rows[std::size_t(nwin + c)]);
      kernels().sparse_attention(qs.data() + i * heads * dim, heads, dim, list.data(), kinds.data(),
                                 int64_t(list.size()), 0.04f, sink.data(),
                                 outs.data() + i * heads * dim);
    }
  });
  j["prefill_attention"] = {{"queries", nq},
                            {"window", nwin},
                            {"compressed_rows_per_query", ncomp},
                            {"us_per_query", tp / double(nq) * 1e6},
                            {"us_per_query_one_query_kernel", t1 / double(nq) * 1e6}};
}

// The vision tower's attention at the released shape (16 heads x 64, n patches, q/k/v rows
// interleaved as the tower holds them): all threads over (head, query block) jobs, at least four
// per thread, as model/fast/fast_vision.cpp splits them; and one head on one thread against the
// scalar tier.
void bench_vision_attention(const KernelBenchOptions& opt, json& j) {
  const int64_t heads = 16, dim = 64, w = heads * dim;
  const float scale = 0.125f;
  ThreadPool pool(opt.threads ? opt.threads : default_thread_count());
  Rng rng(7);
  json& out = j["vision_attention"];
  for (int64_t n : opt.quick ? std::vector<int64_t>{256} : std::vector<int64_t>{1024, 4096}) {
    std::vector<float> qkv(std::size_t(n * 3 * w)), att(std::size_t(n * w));
    for (auto& x : qkv) x = float(rng.uniform(-1, 1));
    const int64_t want_blocks = (4 * int64_t(pool.size()) + heads - 1) / heads;
    const int64_t qb = std::max<int64_t>(64, (n + want_blocks - 1) / want_blocks);
    const int64_t nqb = (n + qb - 1) / qb;
    const double sec = best_time(opt.reps, [&] {
      pool.parallel_for(std::size_t(heads * nqb), [&](std::size_t b, std::size_t e, std::size_t) {
        for (std::size_t job = b; job < e; ++job) {
          const int64_t h = int64_t(job) / nqb, i0 = int64_t(job) % nqb * qb;
          const float* base = qkv.data() + h * dim;
          kernels().vision_attention(base + i0 * 3 * w, base + w, base + 2 * w, 3 * w,
                                     std::min(qb, n - i0), n, 1, dim, scale,
                                     att.data() + i0 * w + h * dim, w);
        }
      });
    });
    out["all_threads"].push_back({{"patches", n},
                                  {"heads", heads},
                                  {"head_dim", dim},
                                  {"ms", sec * 1e3},
                                  {"gflop_per_s", 4.0 * double(n * n) * double(w) / sec / 1e9}});
  }
  // One head, one thread, n = 1024 (quick: 256): the tier against the scalar one (double sums).
  const int64_t n = opt.quick ? 256 : 1024;
  std::vector<float> qkv(std::size_t(n * 3 * dim)), att(std::size_t(n * dim));
  for (auto& x : qkv) x = float(rng.uniform(-1, 1));
  auto one_head = [&](const Kernels& t) {
    return best_time(opt.reps, [&] {
      t.vision_attention(qkv.data(), qkv.data() + dim, qkv.data() + 2 * dim, 3 * dim, n, n, 1, dim,
                         scale, att.data(), dim);
    });
  };
  const double ta = one_head(kernels()), tb = one_head(kernels_for(Isa::kScalar));
  out["one_head_one_thread"] = {{"patches", n},
                                {"head_dim", dim},
                                {"tiers", {isa_name(active_isa()), "scalar"}},
                                {"ms", {ta * 1e3, tb * 1e3}},
                                {"gflop_per_s", 4.0 * double(n * n * dim) / ta / 1e9},
                                {"speedup_over_scalar", tb / ta}};
}

// Cache-row packing and unpacking per row, the tier against the scalar packers.
void bench_cache_pack(const KernelBenchOptions& opt, json& j) {
  // Cache-row packing and unpacking per row (window 512, compressed 512, index key 128): the
  // tier against the scalar packers, one thread.
  std::vector<float> x(512), u(512);
  Rng rng(6);
  for (auto& v : x) v = float(rng.uniform(-3, 3));
  std::vector<uint8_t> row(1024);
  auto per_row_ns = [&](auto fn) {
    constexpr int kCalls = 20000;
    return best_time(opt.reps,
                     [&] {
                       for (int i = 0; i < kCalls; ++i) fn();
                     }) /
           kCalls * 1e9;
  };
  json& cp = j["cache_pack_ns_per_row"];
  const Kernels& sc = kernels_for(Isa::kScalar);
  const Kernels& best = kernels();
  for (const Kernels* t : {&best, &sc}) {
    const std::string tier = t == &sc ? "scalar" : isa_name(best.isa);
    cp[tier] = {
        {"pack_window_512", per_row_ns([&] { t->pack_window_row(x.data(), 512, row.data()); })},
        {"unpack_window_512", per_row_ns([&] { t->unpack_window_row(row.data(), 512, u.data()); })},
        {"pack_compressed_512",
         per_row_ns([&] { t->pack_compressed_row(x.data(), 512, row.data()); })},
        {"unpack_compressed_512",
         per_row_ns([&] { t->unpack_compressed_row(row.data(), 512, u.data()); })},
        {"pack_index_key_128", per_row_ns([&] { t->pack_index_key(x.data(), 128, row.data()); })},
        {"unpack_index_key_128",
         per_row_ns([&] { t->unpack_index_key(row.data(), 128, u.data()); })}};
  }
}

}  // namespace

ReferenceGemm reference_gemm(int64_t m, int64_t n, int64_t k, int reps) {
  const json j = onednn_matmul_json(m, n, k, reps);
  ReferenceGemm r;
  r.gflop_per_s = j.value("gflop_per_s", 0.0);
  r.op = j.value("op", std::string("unavailable"));
  return r;
}

std::string run_kernel_bench(const KernelBenchOptions& opt) {
  const auto t0 = Clock::now();
  const double busy0 = busy_cpu_seconds(), own0 = own_cpu_seconds();
  Bench b(opt);
  json j;
  j["bench"] = "kernels";
  j["isa"] = isa_name(active_isa());
  j["threads"] = b.threads();
  j["read_probe_gb_per_s"] = b.probe();
  json& k = j["kernels"];
  if (opt.quick) {
    k.push_back(b.fp8("fp8_gemv attn.wkv", 512, 1024));
    k.push_back(b.mxfp4("mxfp4_gate_up expert w13", 256, 1024, true));
    k.push_back(b.mxfp4("mxfp4_gemv expert w2", 1024, 256, false));
    if (kernels().aq_fp8_gemm) {
      k.push_back(b.fp8_aq("aq_fp8_gemm attn.wkv", 512, 1024));
      k.push_back(b.mxfp4_aq("aq_mxfp4_gate_up expert w13", 256, 1024, true));
    }
    if (kernels().f32_fp8_gemm) {
      k.push_back(b.fp8_aq("f32_fp8_gemm attn.wkv", 512, 1024, true));
      k.push_back(b.mxfp4_aq("f32_mxfp4_gate_up expert w13", 256, 1024, true, true));
    }
  } else {
    // Real shapes (spec §3.6): q_lora 1280, hidden 5120, 64 heads x 512, expert inter 2304.
    struct Fp8Shape {
      const char* name;
      int64_t out, in;
    };
    const Fp8Shape fp8_shapes[] = {
        {"attn.wq_a", 1280, 5120},         {"attn.wq_b", 32768, 1280},
        {"attn.wkv", 512, 5120},           {"attn.wo_b", 5120, 8192},
        {"shared_experts.w1", 2304, 5120}, {"shared_experts.w2", 5120, 2304}};
    for (const auto& f : fp8_shapes)
      k.push_back(b.fp8(std::string("fp8_gemv ") + f.name, f.out, f.in));
    k.push_back(b.mxfp4("mxfp4_gate_up expert w13", 2304, 5120, true));
    k.push_back(b.mxfp4("mxfp4_gemv expert w2", 5120, 2304, false));
    if (kernels().aq_fp8_gemm) {  // act-quant on: the same shapes through the bf16 GEMMs
      for (const auto& f : fp8_shapes)
        k.push_back(b.fp8_aq(std::string("aq_fp8_gemm ") + f.name, f.out, f.in));
      k.push_back(b.mxfp4_aq("aq_mxfp4_gate_up expert w13", 2304, 5120, true));
      k.push_back(b.mxfp4_aq("aq_mxfp4_gemm expert w2", 5120, 2304, false));
    }
    if (kernels().f32_fp8_gemm) {  // act-quant off: the same shapes through the FMA GEMMs
      for (const auto& f : fp8_shapes)
        k.push_back(b.fp8_aq(std::string("f32_fp8_gemm ") + f.name, f.out, f.in, true));
      k.push_back(b.mxfp4_aq("f32_mxfp4_gate_up expert w13", 2304, 5120, true, true));
      k.push_back(b.mxfp4_aq("f32_mxfp4_gemm expert w2", 5120, 2304, false, true));
    }
  }
  bench_mhc(opt, j);
  j["indexer_scores"] = indexer_case(opt, kernels());
  bench_tier_ab(b, opt, j);
  bench_attention(opt, j);
  bench_vision_attention(opt, j);
  bench_cache_pack(opt, j);
  json& ref = j["reference_library"];
  for (int64_t m : opt.quick ? std::vector<int64_t>{16} : std::vector<int64_t>{16, 2048})
    ref.push_back(b.onednn_matmul(m, opt.quick ? 512 : 5120, opt.quick ? 1024 : 5120));
  // Ours on the same shapes, and the ratio to the library's GFLOP/s of the same m in this run.
  json& ours = j["prefill_gemm_ours"];
  for (const auto& r : ref)
    for (const char* format : {"fp8", "bf16", "mxfp4", "fp8_aq"}) {
      if (std::string(format) == "fp8_aq" && !kernels().aq_fp8_gemm) continue;
      json o =
          b.our_gemm(format, r["m"].get<int64_t>(), r["n"].get<int64_t>(), r["k"].get<int64_t>());
      if (r.contains("gflop_per_s")) {
        o["ratio_vs_reference_library"] =
            o["gflop_per_s"].get<double>() / r["gflop_per_s"].get<double>();
        o["reference_op"] = r["op"];
      }
      ours.push_back(o);
    }
  const double wall = seconds_since(t0);
  const double other = std::max(0.0, (busy_cpu_seconds() - busy0) - (own_cpu_seconds() - own0));
  j["seconds"] = wall;
  j["other_processes_cpu_seconds"] = other;
  j["other_processes_cpu_fraction"] =
      other / (wall * double(std::max(1u, std::thread::hardware_concurrency())));
  return j.dump(1);
}

}  // namespace dsv41::ops
