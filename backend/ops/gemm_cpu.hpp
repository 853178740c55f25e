// Internal to the CPU op twins (*_cpu.cpp): one GEMM entry point for float and double, so
// the ops can be templates on the scalar type, and the column-chunk loop the ops use for
// sums over rows (bias, norm and embedding gradients).
//   gemm: C = alpha · op(A) · op(B) + beta · C, all row-major, op(X) = X or X^T.
//
// Why tiles: OpenBLAS (0.3.21, OpenMP build) splits C between its threads by the thread
// count, and the kernels at the edges of a split round differently from the inner ones, so
// the same product comes out different on 1, 2 or 3 threads (measured: thousands of
// differing elements in a 128³ sgemm). Here C is cut into tiles of a fixed size instead, each
// tile one single-threaded BLAS call (OpenBLAS runs on the calling thread inside an active
// OpenMP region), the tiles shared among the OpenMP threads: the result depends on the
// shapes alone. The inner dimension is never split, so nothing is summed across threads.
#pragma once

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <cstdint>

namespace backend::cpu::detail {

enum class Transpose : bool { no = false, yes = true };

inline CBLAS_TRANSPOSE blas_transpose(Transpose transpose) {
  return transpose == Transpose::yes ? CblasTrans : CblasNoTrans;
}

inline void blas_gemm(Transpose transpose_a, Transpose transpose_b, int64_t m, int64_t n, int64_t k,
                      float alpha, const float* a, int64_t lda, const float* b, int64_t ldb,
                      float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, blas_transpose(transpose_a), blas_transpose(transpose_b),
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c,
              static_cast<blasint>(ldc));
}

inline void blas_gemm(Transpose transpose_a, Transpose transpose_b, int64_t m, int64_t n, int64_t k,
                      double alpha, const double* a, int64_t lda, const double* b, int64_t ldb,
                      double beta, double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, blas_transpose(transpose_a), blas_transpose(transpose_b),
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c,
              static_cast<blasint>(ldc));
}

// Tile of C per BLAS call: square, of an edge chosen from the shape of C alone (never from
// the thread count, so the result stays the same on any number of threads): the largest of
// 512, 256 and 128 that still cuts C into at least kMinimumTiles tiles, so a few cores each get
// several. Larger tiles pack the operands fewer times: on the 126m shapes a step's GEMMs ran at
// 87 % of a 2048³ sgemm with 128-wide tiles and at 91-97 % with 256 to 512
// (docs/benchmarks.md).
inline constexpr int64_t kMinimumTiles = 8;
inline int64_t tile_edge(int64_t m, int64_t n) {
  for (const int64_t edge : {int64_t{512}, int64_t{256}}) {
    if (m * n >= kMinimumTiles * edge * edge) return edge;
  }
  return 128;
}

// OpenBLAS runs a GEMM of at most this many multiply-adds (m·n·k) on the calling thread
// (interface/gemm.c: SMP_THRESHOLD_MIN 65536 × GEMM_MULTITHREAD_THRESHOLD 4 in 0.3.21; the
// smaller 65536 is used here for margin).
inline constexpr int64_t kBlasSingleThreadedWork = 1 << 16;

// m × n result, k the inner dimension; lda/ldb/ldc are row strides in elements. Safe to call
// from inside an OpenMP parallel region (then the calling thread does all the tiles).
template <typename Scalar>
void gemm(Transpose transpose_a, Transpose transpose_b, int64_t m, int64_t n, int64_t k,
          Scalar alpha, const Scalar* a, int64_t lda, const Scalar* b, int64_t ldb, Scalar beta,
          Scalar* c, int64_t ldc) {
  const int64_t edge = tile_edge(m, n);
  const int64_t row_tiles = (m + edge - 1) / edge;
  const int64_t column_tiles = (n + edge - 1) / edge;
  const int64_t tiles = row_tiles * column_tiles;
  // Even a single tile goes through the region when threads are available, so that OpenBLAS
  // sees an active region and does not split the tile over its own threads. Not needed (and
  // an OpenMP region costs more than the product) on one thread, inside an active region, or
  // for products below OpenBLAS's own threshold for threading.
  const bool parallel =
      !omp_in_parallel() && omp_get_max_threads() > 1 && m * n * k > kBlasSingleThreadedWork;
#pragma omp parallel for schedule(dynamic) if (parallel)
  for (int64_t tile = 0; tile < tiles; ++tile) {
    const int64_t row = (tile / column_tiles) * edge;
    const int64_t column = (tile % column_tiles) * edge;
    const int64_t tile_rows = std::min(edge, m - row);
    const int64_t tile_columns = std::min(edge, n - column);
    // Rows [row, row + tile_rows) of op(A) and columns [column, ...) of op(B).
    const Scalar* a_tile = transpose_a == Transpose::no ? a + row * lda : a + row;
    const Scalar* b_tile = transpose_b == Transpose::no ? b + column : b + column * ldb;
    blas_gemm(transpose_a, transpose_b, tile_rows, tile_columns, k, alpha, a_tile, lda, b_tile, ldb,
              beta, c + row * ldc + column, ldc);
  }
}

// Below this many scalar operations an OpenMP region costs more than it saves.
inline constexpr int64_t kParallelWork = 1 << 14;

// Sums over rows are split by column chunks of a fixed width: each column is summed by one
// thread in row order, so the result is the same for every thread count.
inline constexpr int64_t kColumnChunk = 64;

inline int64_t column_chunks(int64_t columns) {
  return (columns + kColumnChunk - 1) / kColumnChunk;
}

// For column chunk `chunk`: the half-open range [begin, end) of columns it covers.
struct ColumnRange {
  int64_t begin;
  int64_t end;
};
inline ColumnRange column_range(int64_t chunk, int64_t columns) {
  return {chunk * kColumnChunk, std::min(columns, (chunk + 1) * kColumnChunk)};
}

// targets[k][c] += the sum over rows of what add_row adds, in row order, one thread per column
// chunk: add_row(row, begin, end, sums) adds the row's terms of columns [begin, end) into
// sums[k][c − begin]. The norms' weight and bias gradients and linear's bias gradient.
template <size_t kSums, typename Scalar, typename AddRow>
void add_column_sums(const std::array<Scalar*, kSums>& targets, int64_t rows, int64_t columns,
                     bool parallel, AddRow add_row) {
  const int64_t chunks = column_chunks(columns);
#pragma omp parallel for if (parallel)
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    const auto [begin, end] = column_range(chunk, columns);
    Scalar sums[kSums][kColumnChunk] = {};
    for (int64_t row = 0; row < rows; ++row) add_row(row, begin, end, sums);
    for (size_t k = 0; k < kSums; ++k) {
      for (int64_t c = begin; c < end; ++c) targets[k][c] += sums[k][c - begin];
    }
  }
}

}  // namespace backend::cpu::detail
