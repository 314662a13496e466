// CPU kernels for decoding steps, registered with XLA as FFI targets by
// t5x.models._cpu_kernels (which builds this file on first use).
//
// A decoding step multiplies a handful of rows (batch x beams) by every weight and
// attends one query per row to the whole KV cache, so it streams the weights and the
// cache from memory once per generated token. XLA:CPU's library products repack the
// weight on every call and read it, and the cache, at a third to a half of the machine's
// read bandwidth. These kernels read each operand front to back, once:
//
//   t5x_packed_matmul   y_i[rows, n_i] = x[rows, k] . w_i for one or more w_i, each packed
//                       once per decode call (in XLA, before the loop) as [n_i / 32, k, 32];
//   t5x_cache_attention o[g, i] = softmax(q[g, i] . k[g] + bias[g, i]) . v[g] for each query
//                       i of group g (g = batch x heads; the queries, the beams of one
//                       example, share its encoder keys and values), k and v in the
//                       cache's [.., head_dim, length] layout: both products and the
//                       softmax in one pass per query, its scores in L1;
//   t5x_cache_step      a decoding step's self-attention: writes the step's key and value
//                       into the caches in place (outputs aliasing the cache operands),
//                       then attends as t5x_cache_attention;
//   t5x_pack_kernel     w [k, n] -> [ceil(n / 32), k, 32] (the packed product's layout),
//                       the last block zero-padded: once per decode call.
//
// Each splits its independent pieces (column blocks, or groups) over XLA's intra-op
// threads. All take and return float32.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

typedef float Vec16 __attribute__((vector_size(64)));

inline Vec16 Load(const float* p) {
  Vec16 v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}

inline void Store(float* p, Vec16 v) { __builtin_memcpy(p, &v, sizeof v); }

// Whether two buffers' dimension lists are equal.
template <typename A, typename B>
bool SameShape(const A& a, const B& b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end());
}

// Runs work(first, last) over [0, n) in chunks, on the calling thread and the pool's.
// The state is shared by pointer so a task the pool starts late, after the caller has
// returned, finds nothing left and exits.
void ParallelFor(ffi::ThreadPool& pool, int64_t n, std::function<void(int64_t, int64_t)> work) {
  struct State {
    std::function<void(int64_t, int64_t)> work;
    int64_t n, chunk;
    std::atomic<int64_t> next{0}, done{0};
    void Run() {
      for (;;) {
        const int64_t first = next.fetch_add(chunk);
        if (first >= n) return;
        const int64_t last = std::min(n, first + chunk);
        work(first, last);
        done.fetch_add(last - first, std::memory_order_release);
      }
    }
  };
  auto state = std::make_shared<State>();
  state->work = std::move(work);
  state->n = n;
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  state->chunk = std::max<int64_t>(1, n / (4 * threads));  // ~4 chunks a thread: even shares
  const int64_t chunks = (n + state->chunk - 1) / state->chunk;
  for (int64_t t = 1; t < std::min(threads, chunks); ++t) {
    pool.Schedule([state] { state->Run(); });
  }
  state->Run();
  while (state->done.load(std::memory_order_acquire) < n) std::this_thread::yield();  // others' chunks
}

// --- t5x_packed_matmul ------------------------------------------------------------------

constexpr int64_t kBlock = 32;           // columns per packed block: two 16-float vectors
constexpr int64_t kAhead = 64 * kBlock;  // prefetch distance in the block, in floats (8 kB)
constexpr int64_t kRowsAtOnce = 8;       // accumulators: 8 rows x 2 vectors

// Rows r < R of x (stride k) times one packed block (k x 32) into y (stride n).
template <int R>
void MultiplyBlock(const float* x, int64_t k, const float* block, float* y, int64_t n) {
  Vec16 acc[R][2] = {};
  for (int64_t i = 0; i < k; ++i) {
    const float* w = block + i * kBlock;
    __builtin_prefetch(w + kAhead);
    __builtin_prefetch(w + kAhead + 16);
    const Vec16 lo = Load(w), hi = Load(w + 16);
    for (int r = 0; r < R; ++r) {
      const float s = x[r * k + i];
      acc[r][0] += s * lo;
      acc[r][1] += s * hi;
    }
  }
  for (int r = 0; r < R; ++r) {
    Store(y + r * n, acc[r][0]);
    Store(y + r * n + 16, acc[r][1]);
  }
}

void MultiplyColumns(const float* x, int64_t rows, int64_t k, const float* block, float* y,
                     int64_t n) {
  for (int64_t r = 0; r < rows; r += kRowsAtOnce) {
    const float* xr = x + r * k;
    float* yr = y + r * n;
    switch (std::min(kRowsAtOnce, rows - r)) {
      case 1: MultiplyBlock<1>(xr, k, block, yr, n); break;
      case 2: MultiplyBlock<2>(xr, k, block, yr, n); break;
      case 3: MultiplyBlock<3>(xr, k, block, yr, n); break;
      case 4: MultiplyBlock<4>(xr, k, block, yr, n); break;
      case 5: MultiplyBlock<5>(xr, k, block, yr, n); break;
      case 6: MultiplyBlock<6>(xr, k, block, yr, n); break;
      case 7: MultiplyBlock<7>(xr, k, block, yr, n); break;
      default: MultiplyBlock<8>(xr, k, block, yr, n); break;
    }
  }
}

// y_i[rows, n_i] = x . w_i for every packed w_i given, in one call: a step's products
// that read the same input (query, key and value; the gated MLP's inputs) split their
// column blocks over the threads together, where one call each woke the pool each time.
ffi::Error PackedMatmul(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::RemainingArgs ws,
                        ffi::RemainingRets ys) {
  const auto xd = x.dimensions();
  if (xd.size() != 2 || ws.size() == 0 || ws.size() != ys.size()) {
    return ffi::Error::InvalidArgument(
        "t5x_packed_matmul expects x [rows, k] and as many packed weights as results");
  }
  struct Product {
    const float* w;
    float* y;
    int64_t blocks;
  };
  std::vector<Product> products;
  int64_t total = 0;
  for (size_t i = 0; i < ws.size(); ++i) {
    auto w = ws.get<ffi::Buffer<ffi::F32>>(i);
    auto y = ys.get<ffi::Buffer<ffi::F32>>(i);
    if (!w.has_value() || !y.has_value()) return ffi::Error::InvalidArgument("t5x_packed_matmul: float32 only");
    const auto wd = w->dimensions();
    const auto yd = (*y)->dimensions();
    if (wd.size() != 3 || yd.size() != 2 || wd[2] != kBlock || wd[1] != xd[1] || yd[0] != xd[0] ||
        yd[1] != wd[0] * kBlock) {
      return ffi::Error::InvalidArgument(
          "t5x_packed_matmul expects x [rows, k], each w [n / 32, k, 32] and its y [rows, n]");
    }
    products.push_back({w->typed_data(), (*y)->typed_data(), wd[0]});
    total += wd[0];
  }
  const float* xs = x.typed_data();
  const int64_t rows = xd[0], k = xd[1];
  ParallelFor(pool, total, [&products, xs, rows, k](int64_t first, int64_t last) {
    int64_t base = 0;  // blocks of the products before `p`
    for (const Product& p : products) {
      for (int64_t b = std::max(first, base); b < std::min(last, base + p.blocks); ++b) {
        const int64_t local = b - base;
        MultiplyColumns(xs, rows, k, p.w + local * k * kBlock, p.y + local * kBlock, p.blocks * kBlock);
      }
      base += p.blocks;
    }
  });
  return ffi::Error::Success();
}

// --- t5x_cache_attention ------------------------------------------------------------------

// A column to write into a cache, row by row, just before each row is read: written all
// at once, the scattered stores missed the cache together and stalled the reads behind them.
struct Column {
  const float* values = nullptr;  // [depth], or none to write
  int64_t at = 0;
  void WriteInto(float* row, int64_t d) const {
    if (values != nullptr) row[at] = values[d];
  }
};

// Asks for the first `used` floats of a row that is read a few rows later. The hardware
// prefetcher alone left the attention kernels reading at about two thirds of the packed
// product's speed: each group is a short stream, the keys and the values two of them.
inline void PrefetchRow(const float* row, int64_t used) {
  for (int64_t l = 0; l < used; l += 16) __builtin_prefetch(row + l);
}

// Rows ahead to prefetch: about kAhead floats (8 kB), at least one row.
inline int64_t RowsAhead(int64_t length) { return std::max<int64_t>(1, kAhead / length); }

// o[d] = sum_{l < used} p[l] c[d, l] (rows `stride` long): one dot product per row of the cache.
void ValuesPrefix(const float* __restrict p, float* __restrict c, float* __restrict o,
                  int64_t depth, int64_t stride, int64_t used, Column column) {
  const int64_t whole = used - used % 32;
  const int64_t ahead = RowsAhead(stride);
  for (int64_t d = 0; d < depth; ++d) {
    float* row = c + d * stride;
    if (d + ahead < depth) PrefetchRow(row + ahead * stride, used);
    column.WriteInto(row, d);
    Vec16 a = {}, b = {};
    for (int64_t l = 0; l < whole; l += 32) {
      a += Load(p + l) * Load(row + l);
      b += Load(p + l + 16) * Load(row + l + 16);
    }
    a += b;
    float sum = 0.0f;
    for (int i = 0; i < 16; ++i) sum += a[i];
    for (int64_t l = whole; l < used; ++l) sum += p[l] * row[l];
    o[d] = sum;
  }
}

// Masked positions carry a bias of about -1e10 (see t5x.models' _mask_to_bias): their
// softmax weight is exactly zero, so the masked tail of a row (the cache past the current
// position) is neither read nor summed; that leaves every result bit as it was.
constexpr float kMasked = -1e9f;

// e^x for 16 lanes: 2^round(x / ln 2) times a degree-6 polynomial on the remainder
// (within 2 ulp of the exact value); 0 below e^-87.3, where float32 flushes anyway.
inline Vec16 Exp(Vec16 x) {
  typedef int32_t Int16 __attribute__((vector_size(64)));
  const Vec16 low = x < -87.3f ? Vec16{} + 1.0f : Vec16{};  // lanes that underflow
  x = x > 88.7f ? Vec16{} + 88.7f : x;
  x = x < -87.3f ? Vec16{} - 87.3f : x;
  const Vec16 t = x * 1.44269504088896341f;
  const Int16 n = __builtin_convertvector(t + (t >= 0.0f ? Vec16{} + 0.5f : Vec16{} - 0.5f), Int16);
  const Vec16 nf = __builtin_convertvector(n, Vec16);
  const Vec16 r = (x - nf * 0.693359375f) + nf * 2.12194440e-4f;
  Vec16 p = Vec16{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const Vec16 e = p * r * r + r + 1.0f;
  Vec16 scale;
  const Int16 bits = (n + 127) << 23;
  __builtin_memcpy(&scale, &bits, sizeof scale);
  return low > 0.0f ? Vec16{} : e * scale;
}

// One group: s = q . k over the visible prefix, softmax with the bias, o = p . v.
void GroupAttention(const float* __restrict q, float* __restrict k, float* __restrict v,
                    const float* __restrict bias, float* __restrict o, float* __restrict s,
                    int64_t depth, int64_t length, Column new_key = {}, Column new_value = {}) {
  int64_t used = length;
  while (used > 0 && bias[used - 1] <= kMasked) --used;
  if (used == 0) used = length;  // all masked: XLA's softmax spreads evenly over them all
  const int64_t padded = (used + 15) / 16 * 16;  // s has room for it (see CacheAttention)
  std::fill(s, s + padded, 0.0f);
  const int64_t ahead = RowsAhead(length);
  for (int64_t d = 0; d < depth; ++d) {
    const float qd = q[d];
    float* __restrict row = k + d * length;
    // The keys' last rows prefetch the values' first.
    const int64_t next = d + ahead;
    if (next < depth) {
      PrefetchRow(k + next * length, used);
    } else if (next < 2 * depth) {
      PrefetchRow(v + (next - depth) * length, used);
    }
    new_key.WriteInto(row, d);
    for (int64_t l = 0; l < used; ++l) s[l] += qd * row[l];
  }
  float top = -INFINITY;
  for (int64_t l = 0; l < used; ++l) {
    s[l] += bias[l];
    top = std::max(top, s[l]);
  }
  for (int64_t l = used; l < padded; ++l) s[l] = -INFINITY;
  Vec16 total = {};
  for (int64_t l = 0; l < padded; l += 16) {
    const Vec16 e = Exp(Load(s + l) - top);
    Store(s + l, e);
    total += e;
  }
  float sum = 0.0f;
  for (int i = 0; i < 16; ++i) sum += total[i];
  const float inverse = 1.0f / sum;
  for (int64_t l = 0; l < used; ++l) s[l] *= inverse;
  ValuesPrefix(s, v, o, depth, length, used, new_value);
}

ffi::Error CacheAttention(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k,
                          ffi::Buffer<ffi::F32> v, ffi::Buffer<ffi::F32> bias,
                          ffi::ResultBuffer<ffi::F32> o) {
  const auto qd = q.dimensions();
  const auto kd = k.dimensions();
  const auto bd = bias.dimensions();
  const auto vd = v.dimensions();
  const auto od = o->dimensions();
  if (qd.size() != 3 || kd.size() != 3 || !SameShape(vd, kd) || !SameShape(od, qd) ||
      bd.size() != 3 || qd[0] != kd[0] || qd[2] != kd[1] || bd[0] != kd[0] || bd[1] != qd[1] ||
      bd[2] != kd[2]) {
    return ffi::Error::InvalidArgument(
        "t5x_cache_attention expects q [groups, queries, depth], k and v [groups, depth, length], "
        "bias [groups, queries, length] and o [groups, queries, depth]");
  }
  const int64_t queries = qd[1], depth = kd[1], length = kd[2];
  const float *qs = q.typed_data(), *ks = k.typed_data(), *vs = v.typed_data(), *bs = bias.typed_data();
  float* os = o->typed_data();
  ParallelFor(pool, kd[0], [=](int64_t first, int64_t last) {
    std::unique_ptr<float[]> scores(new float[length + 16]);
    for (int64_t g = first; g < last; ++g) {
      // A group's queries (the beams of one example) attend one after another: its keys and
      // values come from memory for the first and from the core's cache for the others.
      for (int64_t i = g * queries; i < (g + 1) * queries; ++i) {
        // No column to write: GroupAttention only reads the (const) cache.
        GroupAttention(qs + i * depth, const_cast<float*>(ks + g * depth * length),
                       const_cast<float*>(vs + g * depth * length), bs + i * length, os + i * depth,
                       scores.get(), depth, length);
      }
    }
  });
  return ffi::Error::Success();
}

// --- t5x_cache_step ---------------------------------------------------------------------

// Writes each group's new key and value at its row's position, then attends. XLA's scatter
// took ~50 us per layer and cache for the same 8 x 8 x 64 floats (it walks the update
// element by element); here each group's column goes in just before the group is read.
ffi::Error CacheStep(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> k, ffi::Buffer<ffi::F32> v,
                     ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> new_k, ffi::Buffer<ffi::F32> new_v,
                     ffi::Buffer<ffi::S32> index, ffi::Buffer<ffi::F32> bias,
                     ffi::ResultBuffer<ffi::F32> k_out, ffi::ResultBuffer<ffi::F32> v_out,
                     ffi::ResultBuffer<ffi::F32> o) {
  // The caches keep their own 4-D shape: a reshaped operand made XLA copy each cache
  // before updating it "in place".
  const auto kd = k.dimensions();
  const auto vd = v.dimensions();
  const auto qd = q.dimensions();
  const auto nkd = new_k.dimensions();
  const auto nvd = new_v.dimensions();
  const auto id = index.dimensions();
  const auto bd = bias.dimensions();
  const bool ok = kd.size() == 4 && SameShape(vd, kd) && qd.size() == 3 && SameShape(nkd, qd) &&
                  SameShape(nvd, qd) && qd[0] == kd[0] && qd[1] == kd[1] && qd[2] == kd[2] &&
                  id.size() == 1 && (id[0] == 1 || id[0] == kd[0]) && bd.size() == 3 &&
                  bd[0] == kd[0] && bd[1] == kd[1] && bd[2] == kd[3];
  if (!ok) {
    return ffi::Error::InvalidArgument(
        "t5x_cache_step expects k and v [rows, heads, depth, length], q, new_k and new_v "
        "[rows, heads, depth], index [1] or [rows] and bias [rows, heads, length]");
  }
  const int64_t groups = kd[0] * kd[1], depth = kd[2], length = kd[3];
  const int64_t per_row = id[0] == 1 ? groups : kd[1];
  float *ks = k_out->typed_data(), *vs = v_out->typed_data(), *os = o->typed_data();
  // The outputs alias the caches; should XLA ever hand over separate buffers, start from a copy.
  if (ks != k.typed_data()) std::copy(k.typed_data(), k.typed_data() + groups * depth * length, ks);
  if (vs != v.typed_data()) std::copy(v.typed_data(), v.typed_data() + groups * depth * length, vs);
  const float *qs = q.typed_data(), *nks = new_k.typed_data(), *nvs = new_v.typed_data();
  const float* bs = bias.typed_data();
  const int32_t* positions = index.typed_data();
  ParallelFor(pool, groups, [=](int64_t first, int64_t last) {
    std::unique_ptr<float[]> scores(new float[length + 16]);
    for (int64_t g = first; g < last; ++g) {
      // As XLA's dynamic_update_slice: a position past either end is clamped into the cache.
      const int64_t at = std::clamp<int64_t>(positions[g / per_row], 0, length - 1);
      GroupAttention(qs + g * depth, ks + g * depth * length, vs + g * depth * length, bs + g * length,
                     os + g * depth, scores.get(), depth, length, Column{nks + g * depth, at},
                     Column{nvs + g * depth, at});
    }
  });
  return ffi::Error::Success();
}

// --- t5x_pack_kernel ----------------------------------------------------------------------

ffi::Error PackKernel(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> w, ffi::ResultBuffer<ffi::F32> out) {
  const auto wd = w.dimensions();
  const auto od = out->dimensions();
  if (wd.size() != 2 || od.size() != 3 || od[2] != kBlock || od[1] != wd[0] ||
      od[0] != (wd[1] + kBlock - 1) / kBlock) {
    return ffi::Error::InvalidArgument("t5x_pack_kernel expects w [k, n] and out [ceil(n / 32), k, 32]");
  }
  const int64_t k = wd[0], n = wd[1];
  const float* ws = w.typed_data();
  float* os = out->typed_data();
  ParallelFor(pool, od[0], [=](int64_t first, int64_t last) {
    for (int64_t b = first; b < last; ++b) {
      const int64_t width = std::min(kBlock, n - b * kBlock);
      float* block = os + b * k * kBlock;
      for (int64_t i = 0; i < k; ++i) {
        std::copy(ws + i * n + b * kBlock, ws + i * n + b * kBlock + width, block + i * kBlock);
        std::fill(block + i * kBlock + width, block + (i + 1) * kBlock, 0.0f);
      }
    }
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(T5xPackedMatmul, PackedMatmul,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .RemainingArgs()
                                  .RemainingRets());

XLA_FFI_DEFINE_HANDLER_SYMBOL(T5xCacheAttention, CacheAttention,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(T5xCacheStep, CacheStep,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(T5xPackKernel, PackKernel,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
