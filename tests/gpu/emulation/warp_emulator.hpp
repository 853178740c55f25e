// A CPU emulation of the few CUDA features the tensor-core attention kernels use
// (backend/ops/attention_flash_cuda.cu), so that their tile logic (fragment indexing, masks,
// online softmax, shared-memory tiles and barriers) is checked where there is no GPU, in CI;
// and of what the memory-bound kernels use besides (blockDim and gridDim of any 1-D launch of
// up to 1024 threads, static __shared__ arrays, __syncwarp: launch_kernel, which
// extract_cuda_ops.py puts in place of their <<<...>>> launches).
// A thread block is blockDim.x fibers (ucontext, 128 for the attention kernels) taking turns on
// the calling thread; __syncthreads is
// a barrier of all of them, and a warp's collectives (__shfl_xor_sync, mma) exchange values
// through per-warp slots between two barriers of its 32 fibers. A fiber runs until it waits at
// a barrier, so a block costs switches, not threads: 128 std::threads and std::barrier spent
// two minutes of CI in the kernel's and scheduler's hand-offs for 14 s of work. A barrier no
// fiber can open (one reached in divergent code) is an error naming it, not a hang.
// `mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32` is computed from the fragment
// layout the PTX ISA documents ("Matrix fragments for mma.m16n8k16 with floating point type": the
// same for both element types), written here independently of the kernel's own loads: lane l holds
// groupID g = l / 4 and t = l % 4; A's a0..a7 are (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1),
// then the same at columns + 8; B's b0..b3 are (k 2t, n g), (2t+1, g), (2t+8, g), (2t+9, g);
// C's c0..c3 are (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1). Each lane's own 16 products are
// summed in k order in fp32 (the hardware's order is unspecified, hence the tests' tolerances).
// `ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16` likewise from the layout the PTX ISA
// documents ("Warp-level matrix load instruction: ldmatrix"): lane l gives the address of row
// l % 8 of matrix l / 8 and receives, of matrix m, row l/4's elements 2(l%4) and 2(l%4)+1, or
// transposed the elements (row 2(l%4), column l/4) and (row 2(l%4)+1, column l/4); every row
// address must be 16-byte aligned and inside the block's shared memory.
// `cp.async` (16 bytes, zero-filled when its source size is 0) keeps each thread's copies in
// groups and, by default, writes them at the latest moment the PTX ISA allows: when a
// `cp.async.wait_group` of that thread lets their group go; a tile read before its wait (or
// before the barrier after it, by another thread) then shows the NaN or the stale values it
// would on a GPU that is slow to copy. CopyTiming::at_issue writes them at once instead, which
// (with Schedule::lowest_first, below) shows a copy issued into a buffer other warps still read.
// A thread ending with copies it never waited for is an error.
// Shared memory is a heap buffer of exactly the launch's size, filled with NaN bytes first,
// so reading a place no thread wrote shows, and ASan sees an access past it.
// What it cannot show: a GPU's memory model, its bank conflicts or its speed; tests/gpu checks
// the kernels on a real GPU.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <ucontext.h>
#include <vector_types.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace warp_emulator {

struct Index {
  unsigned x = 0, y = 0, z = 0;
};

struct WarpSlots {
  float value[32];
  const void* address[32];
  uint32_t a[32][4];
  uint32_t b[32][2];
  float c[32][4];
};

inline constexpr int kBlockThreads = 128;  // the attention kernels' block
inline constexpr int kMaxBlockThreads = 1024;

// `expected` fibers meet: the last to arrive opens the next phase and runs on; the others
// wait for it.
struct Barrier {
  int expected = 0;
  int arrived = 0;
  uint64_t phase = 0;
};

struct Fiber {
  ucontext_t context{};
  std::vector<unsigned char> stack;
  const Barrier* waiting = nullptr;  // the barrier it waits at, for phase `waiting_phase` to end
  uint64_t waiting_phase = 0;
  bool done = false;
};

// One thread's cp.async copies: closed groups, oldest first, and the group still open.
struct PendingCopy {
  unsigned char* destination;
  unsigned char bytes[16];
};
struct ThreadCopies {
  std::vector<std::vector<PendingCopy>> committed;
  std::vector<PendingCopy> open;
};

// When cp.async writes shared memory (above).
enum class CopyTiming { at_wait, at_issue };
inline thread_local CopyTiming copy_timing = CopyTiming::at_wait;

// Which thread the scheduler resumes: each runnable one in turn (the warps advance together, a
// warp barrier at a time), or always the lowest-numbered runnable one, so that warp 0 runs until
// it waits at a block barrier before warp 1 runs at all: the order that shows one warp
// overwriting, or reading early, a tile another warp has not finished with.
enum class Schedule { round_robin, lowest_first };
inline thread_local Schedule schedule = Schedule::round_robin;

// The schedule and the copies' timing for a scope (the launches in it), the defaults again after
// it, an exception included.
class ScopedOrder {
 public:
  explicit ScopedOrder(Schedule order, CopyTiming timing = CopyTiming::at_wait) {
    schedule = order;
    copy_timing = timing;
  }
  ~ScopedOrder() {
    schedule = Schedule::round_robin;
    copy_timing = CopyTiming::at_wait;
  }
  ScopedOrder(const ScopedOrder&) = delete;
  ScopedOrder& operator=(const ScopedOrder&) = delete;
};

struct Block {
  // The last warp holds what is left of the threads (a block of one thread: one warp of one).
  explicit Block(int threads)
      : all{threads},
        slots(static_cast<size_t>((threads + 31) / 32)),
        copies(static_cast<size_t>(threads)) {
    for (int first = 0; first < threads; first += 32) {
      warp.push_back(Barrier{threads - first < 32 ? threads - first : 32});
    }
  }
  Barrier all;
  std::vector<Barrier> warp;
  std::vector<WarpSlots> slots;
  std::vector<ThreadCopies> copies;
  unsigned char* shared = nullptr;
  size_t shared_bytes = 0;
  ucontext_t scheduler{};
  Fiber* running = nullptr;
  const void* kernel = nullptr;
  void (*run_kernel)(const void*) = nullptr;
};

inline thread_local Block* block = nullptr;

}  // namespace warp_emulator

inline thread_local warp_emulator::Index threadIdx, blockIdx;
inline thread_local dim3 blockDim, gridDim;

// The kernels' qualifiers mean nothing on the host (cuda_bf16.h defined them for nvcc's use).
#undef __global__
#define __global__
#undef __device__
#define __device__
#undef __host__
#define __host__
#define __launch_bounds__(threads)

namespace warp_emulator {

inline void arrive_and_wait(Barrier& barrier) {
  Block& self = *block;
  const uint64_t phase = barrier.phase;
  if (++barrier.arrived == barrier.expected) {
    barrier.arrived = 0;
    ++barrier.phase;
    return;
  }
  self.running->waiting = &barrier;
  self.running->waiting_phase = phase;
  swapcontext(&self.running->context, &self.scheduler);
}

}  // namespace warp_emulator

// The device's correctly rounded double operations and conversion (the host's IEEE ones) and
// the math functions device code calls unqualified.
inline double __dadd_rn(double a, double b) {
  return a + b;
}
inline double __dmul_rn(double a, double b) {
  return a * b;
}
inline double __ddiv_rn(double a, double b) {
  return a / b;
}
inline float __double2float_rn(double value) {
  return static_cast<float>(value);
}
using std::isfinite;

inline void __syncthreads() { warp_emulator::arrive_and_wait(warp_emulator::block->all); }
inline void __syncwarp(unsigned /*mask*/ = 0xffffffffu) {
  warp_emulator::arrive_and_wait(warp_emulator::block->warp[threadIdx.x / 32]);
}

inline float __shfl_xor_sync(unsigned /*mask*/, float value, int lane_mask) {
  auto& block = *warp_emulator::block;
  const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  block.slots[warp].value[lane] = value;
  warp_emulator::arrive_and_wait(block.warp[warp]);
  const float other = block.slots[warp].value[lane ^ static_cast<unsigned>(lane_mask)];
  warp_emulator::arrive_and_wait(block.warp[warp]);
  return other;
}

namespace warp_emulator {

inline float element_value(__nv_bfloat16 value) { return __bfloat162float(value); }
inline float element_value(__half value) { return __half2float(value); }

// The lower (high = 0) or upper 16 bits of a register as an E (__nv_bfloat16 or __half).
template <typename E>
float register_half(uint32_t word, int high) {
  const auto bits = static_cast<uint16_t>(high ? word >> 16 : word & 0xffffu);
  E value;
  std::memcpy(static_cast<void*>(&value), &bits, sizeof value);
  return element_value(value);
}

// D = A·B + C over one warp, A and B of element type E: every lane deposits its fragments,
// then computes its own four elements of D from the whole A and B.
template <typename E>
void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  Block& self = *block;
  const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  WarpSlots& slots = self.slots[warp];
  for (int i = 0; i < 4; ++i) {
    slots.a[lane][i] = a[i];
    slots.c[lane][i] = d[i];
  }
  slots.b[lane][0] = b0;
  slots.b[lane][1] = b1;
  arrive_and_wait(self.warp[warp]);
  float A[16][16], B[16][8];
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, t = l % 4;
    for (int e = 0; e < 8; ++e) {
      const int row = (e % 4 < 2) ? g : g + 8;
      const int col = 2 * t + (e & 1) + (e >= 4 ? 8 : 0);
      A[row][col] = register_half<E>(slots.a[l][e / 2], e & 1);
    }
    for (int e = 0; e < 4; ++e) {
      const int k = 2 * t + (e & 1) + (e >= 2 ? 8 : 0);
      B[k][g] = register_half<E>(slots.b[l][e / 2], e & 1);
    }
  }
  const int g = static_cast<int>(lane) / 4, t = static_cast<int>(lane) % 4;
  float result[4];
  for (int e = 0; e < 4; ++e) {
    const int row = e < 2 ? g : g + 8, col = 2 * t + (e & 1);
    float sum = slots.c[lane][e];
    for (int k = 0; k < 16; ++k) sum += A[row][k] * B[k][col];
    result[e] = sum;
  }
  arrive_and_wait(self.warp[warp]);  // every lane has read the slots
  for (int e = 0; e < 4; ++e) d[e] = result[e];
}

// `what`'s 16 bytes at `address` lie inside the block's shared memory, 16-byte aligned.
inline void check_shared_16(const void* address, const char* what) {
  const Block& self = *block;
  const auto* byte = static_cast<const unsigned char*>(address);
  if (byte < self.shared || byte + 16 > self.shared + self.shared_bytes ||
      reinterpret_cast<uintptr_t>(address) % 16 != 0) {
    throw std::runtime_error(std::string(what) + " of thread " + std::to_string(threadIdx.x) +
                             ": 16 bytes at offset " + std::to_string(byte - self.shared) + " of " +
                             std::to_string(self.shared_bytes) +
                             " bytes of shared memory, or not 16-byte aligned");
  }
}

// ldmatrix .x4 (.trans with Transposed) from the 32 lanes' row addresses.
template <bool Transposed>
void load_matrices(uint32_t (&r)[4], const void* row) {
  Block& self = *block;
  const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  check_shared_16(row, "ldmatrix's row address");
  self.slots[warp].address[lane] = row;
  arrive_and_wait(self.warp[warp]);
  const auto element = [&](int matrix, int row_in_matrix, int column) {
    const auto* p =
        static_cast<const uint16_t*>(self.slots[warp].address[8 * matrix + row_in_matrix]);
    return static_cast<uint32_t>(p[column]);
  };
  uint32_t result[4];
  for (int m = 0; m < 4; ++m) {
    const int group = static_cast<int>(lane) / 4, pair = 2 * (static_cast<int>(lane) % 4);
    result[m] = Transposed ? element(m, pair, group) | element(m, pair + 1, group) << 16
                           : element(m, group, pair) | element(m, group, pair + 1) << 16;
  }
  arrive_and_wait(self.warp[warp]);  // every lane has read the addresses
  for (int m = 0; m < 4; ++m) r[m] = result[m];
}

// cp.async.cg.shared.global of 16 bytes (zeros where !valid), into this thread's open group.
inline void copy_16_async(void* shared, const void* global, bool valid) {
  check_shared_16(shared, "cp.async's destination");
  PendingCopy copy{static_cast<unsigned char*>(shared), {}};
  if (valid) std::memcpy(copy.bytes, global, 16);
  if (copy_timing == CopyTiming::at_issue) {
    std::memcpy(copy.destination, copy.bytes, 16);
  } else {
    block->copies[threadIdx.x].open.push_back(copy);
  }
}

inline void commit_copies() {
  ThreadCopies& mine = block->copies[threadIdx.x];
  mine.committed.push_back(std::move(mine.open));
  mine.open.clear();
}

// cp.async.wait_group pending: every closed group but the newest `pending` lands now.
inline void wait_copies(int pending) {
  ThreadCopies& mine = block->copies[threadIdx.x];
  while (mine.committed.size() > static_cast<size_t>(pending)) {
    for (const PendingCopy& copy : mine.committed.front()) {
      std::memcpy(copy.destination, copy.bytes, 16);
    }
    mine.committed.erase(mine.committed.begin());
  }
}

// A fiber's life: the block's kernel, then back to the scheduler (uc_link).
inline void run_fiber() {
  Block& self = *block;
  self.run_kernel(self.kernel);
  self.running->done = true;
}

// A fiber set to start run_fiber on its own stack and to return to `scheduler`. (A function of
// its own: getcontext returns twice, which would make the launch's loop counters suspect.)
[[gnu::noinline]] inline void prepare_fiber(Fiber& fiber, ucontext_t* scheduler) {
  fiber.waiting = nullptr;
  fiber.done = false;
  getcontext(&fiber.context);
  fiber.context.uc_stack.ss_sp = fiber.stack.data();
  fiber.context.uc_stack.ss_size = fiber.stack.size();
  fiber.context.uc_link = scheduler;
  makecontext(&fiber.context, run_fiber, 0);
}

// Runs `kernel()` for every block of a (grid_x, grid_y) grid, one block after another, each as
// `threads` fibers (1 to 1024) with `shared_bytes` of NaN-filled dynamic
// shared memory: the scheduler resumes, in turn, every fiber that is not waiting at a barrier
// whose phase is still open.
template <typename Kernel>
void launch_blocks(unsigned grid_x, unsigned grid_y, int threads, size_t shared_bytes,
                   const Kernel& kernel) {
  if (threads < 1 || threads > kMaxBlockThreads) {
    throw std::runtime_error("a block of " + std::to_string(threads) +
                             " threads: the emulation takes 1 to 1024");
  }
  constexpr size_t kStackBytes = size_t{1} << 18;  // the kernels' fragments and tiles' indices
  // The fibers and their stacks are kept from launch to launch: a test launches hundreds of
  // blocks, and zeroing fresh stacks for each cost more than the kernels.
  static thread_local std::vector<Fiber> pool;
  while (pool.size() < static_cast<size_t>(threads)) {
    pool.emplace_back();
    pool.back().stack.resize(kStackBytes);
  }
  const std::span<Fiber> fibers(pool.data(), static_cast<size_t>(threads));
  gridDim = dim3(grid_x, grid_y, 1);
  blockDim = dim3(static_cast<unsigned>(threads), 1, 1);
  for (unsigned y = 0; y < grid_y; ++y) {
    for (unsigned x = 0; x < grid_x; ++x) {
      std::vector<unsigned char> shared(shared_bytes, 0xFF);
      Block context(threads);
      context.shared = shared.data();
      context.shared_bytes = shared_bytes;
      context.kernel = &kernel;
      context.run_kernel = [](const void* k) { (*static_cast<const Kernel*>(k))(); };
      block = &context;
      blockIdx.x = x;
      blockIdx.y = y;
      for (Fiber& fiber : fibers) prepare_fiber(fiber, &context.scheduler);
      for (int remaining = threads; remaining > 0;) {
        bool progressed = false;
        for (unsigned t = 0; t < static_cast<unsigned>(threads); ++t) {
          Fiber& fiber = fibers[t];
          if (fiber.done || (fiber.waiting != nullptr &&
                             fiber.waiting->phase == fiber.waiting_phase)) {
            continue;
          }
          fiber.waiting = nullptr;
          threadIdx.x = t;
          context.running = &fiber;
          swapcontext(&context.scheduler, &fiber.context);
          progressed = true;
          if (fiber.done) --remaining;
          if (schedule == Schedule::lowest_first) break;  // from thread 0 again
        }
        if (!progressed) {
          block = nullptr;
          throw std::runtime_error("block (" + std::to_string(x) + ", " + std::to_string(y) +
                                   "): every thread left waits at a barrier that the others "
                                   "never reach");
        }
      }
      block = nullptr;
      for (unsigned t = 0; t < static_cast<unsigned>(threads); ++t) {
        if (!context.copies[t].committed.empty() || !context.copies[t].open.empty()) {
          throw std::runtime_error("block (" + std::to_string(x) + ", " + std::to_string(y) +
                                   "): thread " + std::to_string(t) +
                                   " ended with cp.async copies it never waited for");
        }
      }
    }
  }
}

// The attention kernels' launches: blocks of kBlockThreads.
template <typename Kernel>
void launch(unsigned grid_x, unsigned grid_y, size_t shared_bytes, const Kernel& kernel) {
  launch_blocks(grid_x, grid_y, kBlockThreads, shared_bytes, kernel);
}

// `kernel<<<grid, block, shared_bytes, stream>>>(...)` as extract_cuda_ops.py rewrites it: a
// 1-D block (y and z of 1), a grid of x and y; run at once, whatever the stream.
template <typename Grid, typename Threads, typename Stream, typename Kernel>
void launch_kernel(Grid grid, Threads block_threads, size_t shared_bytes, Stream /*stream*/,
                   const Kernel& kernel) {
  const dim3 g(grid), b(block_threads);
  if (b.y != 1 || b.z != 1 || g.z != 1) {
    throw std::runtime_error("the emulation launches 1-D blocks on 2-D grids");
  }
  launch_blocks(g.x, g.y, static_cast<int>(b.x), shared_bytes, kernel);
}

}  // namespace warp_emulator
