// The fast path's vision tower (fast_vision.h). Layouts as the reference reads them
// (docs/vision.md): wqkv rows q, k, v; mlp.w1 rows gate, then up; 2-D rotate-half RoPE on the first
// half of each head's dims (first quarter by patch row, second by column).
#include "model/fast/fast_vision.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/dtypes.h"
#include "core/thread_pool.h"
#include "model/fast/converted_weights.h"
#include "model/inventory.h"
#include "ops/kernels.h"

namespace dsv41 {
namespace fast_vision_detail {

struct Lin {
  const uint16_t* w = nullptr;
  int64_t out = 0, in = 0;
  std::vector<float> bias;  // empty: none
};

struct Block {
  std::vector<float> norm1, norm2;
  Lin wqkv, wo, w1, w2;
};

}  // namespace fast_vision_detail
namespace {

std::vector<float> bf16_vec(const WeightSpan& s) {
  std::vector<float> v(std::size_t(s.bytes / 2));
  const auto* p = reinterpret_cast<const uint16_t*>(s.data);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = bf16_to_float(p[i]);
  return v;
}

}  // namespace

using fast_vision_detail::Block;
using fast_vision_detail::Lin;

struct FastVisionTower::Impl {
  ModelConfig cfg;
  const ops::Kernels* kern = nullptr;
  ThreadPool* pool = nullptr;
  Lin patch, a1, a2;
  std::vector<Block> blocks;
  std::vector<float> final_norm;

  // y [n, l.out] = x [n, l.in] W^T + b, the rows of W split over the threads.
  void linear(const Lin& l, const float* x, int64_t n, float* y) const {
    const int64_t parts = int64_t(pool->size());
    const int64_t chunk = std::max<int64_t>(16, ((l.out + parts - 1) / parts + 15) / 16 * 16);
    const int64_t nchunks = (l.out + chunk - 1) / chunk;
    pool->parallel_for(std::size_t(nchunks), [&](std::size_t b, std::size_t e, std::size_t) {
      for (std::size_t c = b; c < e; ++c) {
        const int64_t r0 = int64_t(c) * chunk, r1 = std::min(l.out, r0 + chunk);
        kern->bf16_gemm(l.w + r0 * l.in, r1 - r0, l.in, x, n, y + r0, l.out);
        if (!l.bias.empty())
          for (int64_t t = 0; t < n; ++t)
            for (int64_t o = r0; o < r1; ++o) y[t * l.out + o] += l.bias[std::size_t(o)];
      }
    });
  }

  // fn(t0, t1) over [0, n), split over the threads.
  template <typename F>
  void rows(int64_t n, F&& fn) const {
    pool->parallel_for(std::size_t(n), [&](std::size_t b, std::size_t e, std::size_t) {
      fn(int64_t(b), int64_t(e));
    });
  }

  void attention(const std::vector<float>& qkv, int64_t n, float* att) const;
};

FastVisionTower::~FastVisionTower() = default;

Result<std::unique_ptr<FastVisionTower>> FastVisionTower::create(const ConvertedWeights& w,
                                                                 ThreadPool& pool) {
  const ModelConfig& cfg = w.config();
  if (!cfg.vision)
    return Status::error(w.dir() + ": config.json has no vision_config (a text-only model)");
  for (const ExpectedTensor& t : expected_vision_tensors(cfg))
    if (!w.has(t.name))
      return Status::error(w.dir() + ": the vision tower's tensor " + t.name + " is missing");
  std::unique_ptr<FastVisionTower> tower(new FastVisionTower());
  tower->impl_ = std::make_unique<Impl>();
  Impl& im = *tower->impl_;
  im.cfg = cfg;
  im.kern = &ops::kernels();
  im.pool = &pool;
  auto lin = [&](const std::string& base, bool bias) {
    const WeightSpan& s = w.get(base + ".weight");
    Lin l{reinterpret_cast<const uint16_t*>(s.data), s.rows(), s.cols(), {}};
    if (bias) l.bias = bf16_vec(w.get(base + ".bias"));
    return l;
  };
  im.patch = lin("vision.patch_embed.proj", true);
  for (int64_t k = 0; k < cfg.vision->num_hidden_layers; ++k) {
    const std::string B = "vision.blocks." + std::to_string(k) + ".";
    Block b;
    b.norm1 = bf16_vec(w.get(B + "norm1.weight"));
    b.norm2 = bf16_vec(w.get(B + "norm2.weight"));
    b.wqkv = lin(B + "attn.wqkv", true);
    b.wo = lin(B + "attn.wo", true);
    b.w1 = lin(B + "mlp.w1", false);
    b.w2 = lin(B + "mlp.w2", false);
    im.blocks.push_back(std::move(b));
  }
  im.final_norm = bf16_vec(w.get("vision.norm.weight"));
  im.a1 = lin("aligner.w1", true);
  im.a2 = lin("aligner.w2", true);
  return tower;
}

// Per head, every patch attends to every patch (no mask): softmax(q . k / sqrt(hd)) . v by the
// kernels' vision_attention (a blocked online softmax in fp32 on the SIMD tiers). The jobs are
// (head, query block) pairs split over the threads, at least four per thread (16 heads on 2
// threads: one block per head): each call packs its head's keys and values (n rows 3 x width
// apart, read from memory at the released shape; with 256-query blocks that was a fifth of the
// time at 4,096 patches), so blocks are as long as the balance allows. A query row's result does
// not depend on the split (the kernel's reduction order is per row), so one thread and two give
// the same bits.
void FastVisionTower::Impl::attention(const std::vector<float>& qkv, int64_t n, float* att) const {
  const VisionConfig& v = *cfg.vision;
  const int64_t W = v.hidden_size, H = v.num_attention_heads, hd = W / H;
  const float scale = 1.0f / std::sqrt(float(hd));
  const int64_t want_blocks = (4 * int64_t(pool->size()) + H - 1) / H;  // per head
  const int64_t qblock = std::max<int64_t>(64, (n + want_blocks - 1) / want_blocks);
  const int64_t nqb = (n + qblock - 1) / qblock;
  pool->parallel_for(std::size_t(H * nqb), [&](std::size_t b, std::size_t e, std::size_t) {
    for (std::size_t job = b; job < e; ++job) {
      const int64_t hh = int64_t(job) / nqb, i0 = int64_t(job) % nqb * qblock;
      const float* base = qkv.data() + hh * hd;
      kern->vision_attention(base + i0 * 3 * W, base + W, base + 2 * W, 3 * W,
                             std::min(qblock, n - i0), n, 1, hd, scale, att + i0 * W + hh * hd, W);
    }
  });
}

FastVisionTower::Rows FastVisionTower::encode(const std::vector<uint16_t>& patches, int64_t vit_w,
                                              int64_t vit_h) const {
  const Impl& im = *impl_;
  const VisionConfig& v = *im.cfg.vision;
  const int64_t W = v.hidden_size, H = v.num_attention_heads, hd = W / H, I = v.intermediate_size;
  const int64_t n = vit_w * vit_h, in = im.patch.in;
  DSV41_CHECK(int64_t(patches.size()) == n * in && hd * H == W && hd % 4 == 0);
  const float eps = 1e-6f;
  Rows out;
  std::vector<float>& x = out.vit;
  x.assign(std::size_t(n * W), 0.0f);
  {
    std::vector<float> p(patches.size());
    for (std::size_t i = 0; i < p.size(); ++i) p[i] = bf16_to_float(patches[i]);
    im.linear(im.patch, p.data(), n, x.data());
  }
  // 2-D RoPE tables: quarter q = hd / 4 rotated by rotate-half in q / 2 pairs, angle pos *
  // theta^(-2i / q), for every patch row and column index.
  const int64_t q = hd / 4, half = q / 2, npos = std::max(vit_w, vit_h);
  const double theta = v.rope_theta > 0 ? v.rope_theta : 10000.0;
  std::vector<float> cs(std::size_t(npos * half)), sn(std::size_t(npos * half));
  for (int64_t pos = 0; pos < npos; ++pos)
    for (int64_t i = 0; i < half; ++i) {
      const double a = double(pos) * std::pow(theta, -double(2 * i) / double(q));
      cs[std::size_t(pos * half + i)] = float(std::cos(a));
      sn[std::size_t(pos * half + i)] = float(std::sin(a));
    }
  auto rope = [&](float* base, int64_t pos) {
    for (int64_t i = 0; i < half; ++i) {
      const float c = cs[std::size_t(pos * half + i)], s = sn[std::size_t(pos * half + i)];
      const float x0 = base[i], x1 = base[i + half];
      base[i] = x0 * c - x1 * s;
      base[i + half] = x1 * c + x0 * s;
    }
  };
  std::vector<float> h(std::size_t(n * W)), qkv(std::size_t(n * 3 * W)), att(std::size_t(n * W)),
      o(std::size_t(n * W)), g(std::size_t(n * 2 * I)), a(std::size_t(n * I));
  for (const Block& b : im.blocks) {
    im.rows(n, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t)
        im.kern->rmsnorm(x.data() + t * W, b.norm1.data(), W, eps, h.data() + t * W);
    });
    im.linear(b.wqkv, h.data(), n, qkv.data());
    im.rows(n, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t)
        for (int64_t hh = 0; hh < H; ++hh)
          for (int64_t part = 0; part < 2; ++part) {  // q, then k
            float* base = qkv.data() + t * 3 * W + part * W + hh * hd;
            rope(base, t / vit_w);
            rope(base + q, t % vit_w);
          }
    });
    im.attention(qkv, n, att.data());
    im.linear(b.wo, att.data(), n, o.data());
    im.rows(n, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        float* xt = x.data() + t * W;
        for (int64_t j = 0; j < W; ++j) xt[j] += o[std::size_t(t * W + j)];
        im.kern->rmsnorm(xt, b.norm2.data(), W, eps, h.data() + t * W);
      }
    });
    im.linear(b.w1, h.data(), n, g.data());
    im.rows(n, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t)
        for (int64_t j = 0; j < I; ++j) {
          const float gt = g[std::size_t(t * 2 * I + j)];
          a[std::size_t(t * I + j)] =
              gt / (1.0f + std::exp(-gt)) * g[std::size_t(t * 2 * I + I + j)];
        }
    });
    im.linear(b.w2, a.data(), n, o.data());
    for (std::size_t i = 0; i < x.size(); ++i) x[i] += o[i];
  }
  im.rows(n, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      im.kern->rmsnorm(x.data() + t * W, im.final_norm.data(), W, eps, x.data() + t * W);
  });
  // Aligner: the 3 x 3 unshuffle (channel first, zeros past the grid), w1, exact GELU, w2.
  const int64_t r = v.downsample_ratio, lw = (vit_w + r - 1) / r, lh = (vit_h + r - 1) / r;
  const int64_t D = im.a2.out, F = W * r * r;
  std::vector<float> f(std::size_t(lh * lw * F), 0.0f), y(std::size_t(lh * lw * D));
  for (int64_t by = 0; by < lh; ++by)
    for (int64_t bx = 0; bx < lw; ++bx) {
      float* ft = f.data() + (by * lw + bx) * F;
      for (int64_t ky = 0; ky < r; ++ky)
        for (int64_t kx = 0; kx < r; ++kx) {
          const int64_t yy = by * r + ky, xx = bx * r + kx;
          if (yy >= vit_h || xx >= vit_w) continue;
          const float* src = x.data() + (yy * vit_w + xx) * W;
          for (int64_t c = 0; c < W; ++c) ft[c * r * r + ky * r + kx] = src[c];
        }
    }
  im.linear(im.a1, f.data(), lh * lw, y.data());
  for (float& e : y) e = 0.5f * e * (1.0f + std::erf(e / std::sqrt(2.0f)));
  out.aligned.resize(std::size_t(lh * lw * D));
  im.linear(im.a2, y.data(), lh * lw, out.aligned.data());
  return out;
}

}  // namespace dsv41
