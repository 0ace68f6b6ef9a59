// The reference vision tower (vision_tower.h). Layout choices the spec does not spell out, kept
// in one place here and in docs/vision.md: `attn.wqkv` rows are q, then k, then v (each of the
// tower's width, heads in order); `mlp.w1` rows are the gate, then the up projection; the 2-D RoPE
// rotates the first half of each head's dims, its first quarter by the patch's row and its second
// by its column, each quarter by rotate-half (dim i with i + quarter / 2) at frequencies
// theta^(-2i / quarter).
#include "model/reference/vision_tower.h"

#include <cmath>

#include "model/reference/reference_weights.h"

namespace dsv41::ref {
namespace {

// y = W x + b for one row.
template <typename T>
void linear(const WeightView& w, const std::vector<T>& b, const T* x, T* y) {
  matvec(w, x, y);
  for (int64_t r = 0; r < w.rows; ++r) y[r] += b.empty() ? T(0) : b[std::size_t(r)];
}

// Rotate-half RoPE over `n` dims of x at angle pos * theta^(-2i / n) for pair i.
template <typename T>
void rope_half(T* x, int64_t n, T pos, T theta) {
  const int64_t h = n / 2;
  for (int64_t i = 0; i < h; ++i) {
    const T inv = std::pow(theta, -T(2 * i) / T(n));
    const T a = pos * inv, c = std::cos(a), s = std::sin(a);
    const T x0 = x[i], x1 = x[i + h];
    x[i] = x0 * c - x1 * s;
    x[i + h] = x1 * c + x0 * s;
  }
}

template <typename T>
T gelu_erf(T x) {
  return T(0.5) * x * (T(1) + std::erf(x / std::sqrt(T(2))));
}

}  // namespace

template <typename T>
void unshuffle_row(const Mat<T>& vit, int64_t vit_w, int64_t vit_h, int64_t r, int64_t by,
                   int64_t bx, T* out) {
  const int64_t W = vit.cols;
  for (int64_t c = 0; c < W; ++c)
    for (int64_t ky = 0; ky < r; ++ky)
      for (int64_t kx = 0; kx < r; ++kx) {
        const int64_t y = by * r + ky, x = bx * r + kx;
        out[c * r * r + ky * r + kx] = (y < vit_h && x < vit_w) ? vit.row(y * vit_w + x)[c] : T(0);
      }
}

template <typename T>
VisionRows<T> vision_tower(const Checkpoint& ckpt, const ModelConfig& cfg,
                           const std::vector<uint16_t>& patches, int64_t vit_w, int64_t vit_h) {
  DSV41_CHECK(cfg.vision.has_value());
  const VisionConfig& v = *cfg.vision;
  const WeightReader wr(ckpt, {128, 128});
  const int64_t W = v.hidden_size, H = v.num_attention_heads, hd = W / H, I = v.intermediate_size;
  const int64_t n = vit_w * vit_h, in = 3 * v.patch_size * v.patch_size;
  DSV41_CHECK(int64_t(patches.size()) == n * in && hd * H == W && hd % 4 == 0);
  const T eps = T(1e-6), theta = T(v.rope_theta > 0 ? v.rope_theta : 10000.0);
  VisionRows<T> out;
  Mat<T>& x = out.vit;
  x.rows = n, x.cols = W, x.v.assign(std::size_t(n * W), T(0));
  {  // patch embedding
    const WeightView pw = wr.mat("vision.patch_embed.proj.weight");
    const auto pb = wr.vec<T>("vision.patch_embed.proj.bias");
    std::vector<T> p(static_cast<std::size_t>(in));
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t i = 0; i < in; ++i)
        p[std::size_t(i)] = T(bf16_to_float(patches[std::size_t(t * in + i)]));
      linear(pw, pb, p.data(), x.v.data() + t * W);
    }
  }
  std::vector<T> h(static_cast<std::size_t>(W)), q(static_cast<std::size_t>(n * W)),
      k(static_cast<std::size_t>(n * W)), val(static_cast<std::size_t>(n * W)),
      qkv(static_cast<std::size_t>(3 * W)), att(static_cast<std::size_t>(n * W)),
      o(static_cast<std::size_t>(W)), g(static_cast<std::size_t>(2 * I)),
      a(static_cast<std::size_t>(I)), score(static_cast<std::size_t>(n));
  const T scale = T(1) / std::sqrt(T(hd));
  for (int64_t blk = 0; blk < v.num_hidden_layers; ++blk) {
    const std::string B = "vision.blocks." + std::to_string(blk) + ".";
    const auto n1 = wr.vec<T>(B + "norm1.weight"), n2 = wr.vec<T>(B + "norm2.weight");
    const WeightView wqkv = wr.mat(B + "attn.wqkv.weight"), wo = wr.mat(B + "attn.wo.weight");
    const auto bqkv = wr.vec<T>(B + "attn.wqkv.bias"), bo = wr.vec<T>(B + "attn.wo.bias");
    const WeightView w1 = wr.mat(B + "mlp.w1.weight"), w2 = wr.mat(B + "mlp.w2.weight");
    for (int64_t t = 0; t < n; ++t) {
      rmsnorm(x.row(t), n1.data(), W, eps, h.data());
      linear(wqkv, bqkv, h.data(), qkv.data());
      for (int64_t j = 0; j < W; ++j) {
        q[std::size_t(t * W + j)] = qkv[std::size_t(j)];
        k[std::size_t(t * W + j)] = qkv[std::size_t(W + j)];
        val[std::size_t(t * W + j)] = qkv[std::size_t(2 * W + j)];
      }
      const T row = T(t / vit_w), col = T(t % vit_w);
      for (int64_t hh = 0; hh < H; ++hh)
        for (T* base : {q.data() + t * W + hh * hd, k.data() + t * W + hh * hd}) {
          rope_half(base, hd / 4, row, theta);
          rope_half(base + hd / 4, hd / 4, col, theta);
        }
    }
    // Full bidirectional attention over the image's patches, per head.
    for (int64_t t = 0; t < n; ++t)
      for (int64_t hh = 0; hh < H; ++hh) {
        const T* qt = q.data() + t * W + hh * hd;
        T mx = -std::numeric_limits<T>::infinity();
        for (int64_t s = 0; s < n; ++s) {
          score[std::size_t(s)] = dot(qt, k.data() + s * W + hh * hd, hd) * scale;
          mx = std::max(mx, score[std::size_t(s)]);
        }
        T sum = 0;
        for (int64_t s = 0; s < n; ++s)
          sum += (score[std::size_t(s)] = std::exp(score[std::size_t(s)] - mx));
        T* ot = att.data() + t * W + hh * hd;
        for (int64_t d = 0; d < hd; ++d) ot[d] = 0;
        for (int64_t s = 0; s < n; ++s) {
          const T p = score[std::size_t(s)] / sum;
          const T* vs = val.data() + s * W + hh * hd;
          for (int64_t d = 0; d < hd; ++d) ot[d] += p * vs[d];
        }
      }
    for (int64_t t = 0; t < n; ++t) {
      T* xt = x.v.data() + t * W;
      linear(wo, bo, att.data() + t * W, o.data());
      for (int64_t j = 0; j < W; ++j) xt[j] += o[std::size_t(j)];
      rmsnorm(xt, n2.data(), W, eps, h.data());
      matvec(w1, h.data(), g.data());
      for (int64_t j = 0; j < I; ++j)
        a[std::size_t(j)] = silu(g[std::size_t(j)]) * g[std::size_t(I + j)];
      matvec(w2, a.data(), o.data());
      for (int64_t j = 0; j < W; ++j) xt[j] += o[std::size_t(j)];
    }
  }
  {
    const auto nf = wr.vec<T>("vision.norm.weight");
    for (int64_t t = 0; t < n; ++t) rmsnorm(x.row(t), nf.data(), W, eps, x.v.data() + t * W);
  }
  // Aligner: 3 x 3 unshuffle, w1, exact GELU, w2.
  const int64_t r = v.downsample_ratio, lw = (vit_w + r - 1) / r, lh = (vit_h + r - 1) / r;
  const int64_t D = cfg.text.hidden_size;
  const WeightView a1 = wr.mat("aligner.w1.weight"), a2 = wr.mat("aligner.w2.weight");
  const auto b1 = wr.vec<T>("aligner.w1.bias"), b2 = wr.vec<T>("aligner.w2.bias");
  out.aligned.rows = lh * lw, out.aligned.cols = D;
  out.aligned.v.assign(std::size_t(lh * lw * D), T(0));
  std::vector<T> f(static_cast<std::size_t>(W * r * r)), y(static_cast<std::size_t>(D));
  for (int64_t by = 0; by < lh; ++by)
    for (int64_t bx = 0; bx < lw; ++bx) {
      unshuffle_row(x, vit_w, vit_h, r, by, bx, f.data());
      linear(a1, b1, f.data(), y.data());
      for (T& e : y) e = gelu_erf(e);
      linear(a2, b2, y.data(), out.aligned.v.data() + (by * lw + bx) * D);
    }
  return out;
}

template VisionRows<float> vision_tower(const Checkpoint&, const ModelConfig&,
                                        const std::vector<uint16_t>&, int64_t, int64_t);
template VisionRows<double> vision_tower(const Checkpoint&, const ModelConfig&,
                                         const std::vector<uint16_t>&, int64_t, int64_t);
template void unshuffle_row(const Mat<float>&, int64_t, int64_t, int64_t, int64_t, int64_t, float*);
template void unshuffle_row(const Mat<double>&, int64_t, int64_t, int64_t, int64_t, int64_t,
                            double*);

}  // namespace dsv41::ref
