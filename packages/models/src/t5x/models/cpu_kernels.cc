// CPU kernels for decoding steps, registered with XLA as FFI targets by
// t5x.models._cpu_kernels (which builds this file on first use).
//
// A decoding step multiplies a handful of rows (batch x beams) by every weight and
// attends one query per row to the whole KV cache, so it streams the weights and the
// cache from memory once per generated token. XLA:CPU's library products repack the
// weight on every call and read it, and the cache, at a third to a half of the machine's
// read bandwidth. These kernels read each operand front to back, once:
//
//   t5x_packed_matmul   y[rows, n] = x[rows, k] . w, with w packed once per decode call
//                       (in XLA, before the loop) as [n / 32, k, 32];
//   t5x_cache_logits    s[g, l] = sum_d q[g, d] c[g, d, l]   (g = batch x heads; the
//   t5x_cache_values    o[g, d] = sum_l p[g, l] c[g, d, l]    cache's [.., head_dim, length]).
//
// Each splits its independent pieces (column blocks, or groups) over XLA's intra-op
// threads. All take and return float32.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>

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

ffi::Error PackedMatmul(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w,
                        ffi::ResultBuffer<ffi::F32> y) {
  const auto xd = x.dimensions();
  const auto wd = w.dimensions();
  const auto yd = y->dimensions();
  if (xd.size() != 2 || wd.size() != 3 || yd.size() != 2 || wd[2] != kBlock || wd[1] != xd[1] ||
      yd[0] != xd[0] || yd[1] != wd[0] * kBlock) {
    return ffi::Error::InvalidArgument(
        "t5x_packed_matmul expects x [rows, k], w [n / 32, k, 32] and y [rows, n]");
  }
  const float* xs = x.typed_data();
  const float* ws = w.typed_data();
  float* ys = y->typed_data();
  const int64_t rows = xd[0], k = xd[1], blocks = wd[0];
  ParallelFor(pool, blocks, [=](int64_t first, int64_t last) {
    for (int64_t b = first; b < last; ++b) {
      MultiplyColumns(xs, rows, k, ws + b * k * kBlock, ys + b * kBlock, blocks * kBlock);
    }
  });
  return ffi::Error::Success();
}

// --- t5x_cache_logits / t5x_cache_values --------------------------------------------------

// s[l] = sum_d q[d] c[d, l]: the cache read row by row, the scores kept in L1.
void GroupLogits(const float* __restrict q, const float* __restrict c, float* __restrict s,
                 int64_t depth, int64_t length) {
  std::fill(s, s + length, 0.0f);
  for (int64_t d = 0; d < depth; ++d) {
    const float qd = q[d];
    const float* __restrict row = c + d * length;
    for (int64_t l = 0; l < length; ++l) s[l] += qd * row[l];
  }
}

// o[d] = sum_l p[l] c[d, l]: one dot product per row of the cache.
void GroupValues(const float* __restrict p, const float* __restrict c, float* __restrict o,
                 int64_t depth, int64_t length) {
  const int64_t whole = length - length % 32;
  for (int64_t d = 0; d < depth; ++d) {
    const float* row = c + d * length;
    Vec16 a = {}, b = {};
    for (int64_t l = 0; l < whole; l += 32) {
      a += Load(p + l) * Load(row + l);
      b += Load(p + l + 16) * Load(row + l + 16);
    }
    a += b;
    float sum = 0.0f;
    for (int i = 0; i < 16; ++i) sum += a[i];
    for (int64_t l = whole; l < length; ++l) sum += p[l] * row[l];
    o[d] = sum;
  }
}

// Runs Group(operand row, cache group, output row, depth, length) for every group of a
// [groups, depth, length] cache. The operand's rows are `depth` wide and the output's
// `length` wide (kLogits), or the other way round.
template <void (*Group)(const float*, const float*, float*, int64_t, int64_t), bool kLogits>
ffi::Error OverGroups(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> a, ffi::Buffer<ffi::F32> c,
                      ffi::ResultBuffer<ffi::F32> o) {
  const auto ad = a.dimensions();
  const auto cd = c.dimensions();
  const auto od = o->dimensions();
  if (cd.size() != 3 || ad.size() != 2 || od.size() != 2) {
    return ffi::Error::InvalidArgument("t5x cache kernels take 2-D rows and a 3-D cache");
  }
  const int64_t groups = cd[0], depth = cd[1], length = cd[2];
  const int64_t in = kLogits ? depth : length, out = kLogits ? length : depth;
  if (ad[0] != groups || od[0] != groups || ad[1] != in || od[1] != out) {
    return ffi::Error::InvalidArgument(
        kLogits ? "t5x_cache_logits expects q [groups, depth] and s [groups, length]"
                : "t5x_cache_values expects p [groups, length] and o [groups, depth]");
  }
  const float* as = a.typed_data();
  const float* cs = c.typed_data();
  float* os = o->typed_data();
  ParallelFor(pool, groups, [=](int64_t first, int64_t last) {
    for (int64_t g = first; g < last; ++g) {
      Group(as + g * in, cs + g * depth * length, os + g * out, depth, length);
    }
  });
  return ffi::Error::Success();
}

}  // namespace

#define T5X_BINARY_F32_HANDLER(symbol, impl)                                            \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(symbol, impl,                                           \
                                ffi::Ffi::Bind()                                        \
                                    .Ctx<ffi::ThreadPool>()                             \
                                    .Arg<ffi::Buffer<ffi::F32>>()                       \
                                    .Arg<ffi::Buffer<ffi::F32>>()                       \
                                    .Ret<ffi::Buffer<ffi::F32>>())

T5X_BINARY_F32_HANDLER(T5xPackedMatmul, PackedMatmul);
T5X_BINARY_F32_HANDLER(T5xCacheLogits, (OverGroups<GroupLogits, true>));
T5X_BINARY_F32_HANDLER(T5xCacheValues, (OverGroups<GroupValues, false>));
