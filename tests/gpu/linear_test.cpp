// linear_forward / linear_backward on the CUDA device (cuBLASLt) against the CPU device, fp32,
// bf16 and fp16, with and without bias, awkward shapes (1 row, widths that are not multiples of
// 8), parameter gradients accumulating (+=, started from non-zero values), run to run identical;
// linear_gelu's fused epilogues (GELU_AUX_BIAS, DGELU) and their fallback (F not a multiple of 8,
// fp32) against the CPU twin.
#include <doctest/doctest.h>

#include <cstdint>
#include <sstream>
#include <string>

#include "backend/ops/linear_gelu.hpp"
#include "gpu/gpu_test_support.hpp"

using backend::ElementType;
using backend::View;
namespace ops = backend::ops;
using namespace gpu_test;

TEST_CASE("linear on the CUDA device matches the CPU device (fp32, bf16, fp16)") {
  auto gpu = open_gpu_or_skip(/*cpu_stand_in_allowed=*/true);
  if (!gpu) return;
  struct Shape {
    int64_t rows, in, out;
    bool bias, dinput;
  };
  for (const Shape s : {Shape{1, 13, 5, true, true}, Shape{7, 100, 770, true, true},
                        Shape{129, 770, 100, false, true}, Shape{129, 64, 96, true, false},
                        Shape{33, 8, 24, true, true}}) {
    for (ElementType type : {ElementType::f32, ElementType::bf16, ElementType::f16}) {
      std::ostringstream what;
      what << "linear rows " << s.rows << " in " << s.in << " out " << s.out
           << (s.bias ? " with bias" : " without bias") << (s.dinput ? "" : " no dinput");
      const auto x = representable(random_values(s.rows * s.in, 1), type);
      const auto w = representable(random_values(s.out * s.in, 2, 0.1f), type);
      const auto b = representable(random_values(s.out, 3), type);
      const auto dy = representable(random_values(s.rows * s.out, 4), type);
      const auto dw0 = random_values(s.out * s.in, 5);  // fp32 on every device
      const auto db0 = random_values(s.out, 6);
      check_against_cpu(*gpu, what.str(), type, tolerance(type, 5e-5),
                        [&](Tensors& t, ElementType dtype) {
                          Device& device = t.device();
                          View y = t.poisoned(s.rows * s.out, dtype);
                          ops::linear_forward(device, y, t.input(x, dtype), t.input(w, dtype),
                                              s.bias ? t.input(b, dtype) : t.empty(dtype), s.rows,
                                              s.in, s.out);
                          View dx = s.dinput ? t.poisoned(s.rows * s.in, dtype) : t.empty(dtype);
                          View dw = t.input(dw0, ElementType::f32);
                          View db = s.bias ? t.input(db0, ElementType::f32)
                                           : t.empty(ElementType::f32);
                          ops::linear_backward(device, dx, dw, db, t.input(dy, dtype),
                                               t.input(x, dtype), t.input(w, dtype), s.rows, s.in,
                                               s.out);
                          Outputs outputs{{"output", t.read(y)}, {"dweight (+=)", t.read(dw)}};
                          if (s.dinput) outputs.push_back({"dinput", t.read(dx)});
                          if (s.bias) outputs.push_back({"dbias (+=)", t.read(db)});
                          return outputs;
                        });
    }
  }
}

TEST_CASE("linear with GELU in the epilogue on the CUDA device matches the CPU device") {
  auto gpu = open_gpu_or_skip(/*cpu_stand_in_allowed=*/true);
  if (!gpu) return;
  struct Shape {
    int64_t rows, hidden, features;
    bool bias;
  };
  // 3072 and 96: the epilogue's aux ld is a multiple of 8; 100 and 13 are not (separate kernels).
  for (const Shape s :
       {Shape{64, 768, 3072, true}, Shape{129, 64, 96, true}, Shape{33, 40, 96, false},
        Shape{7, 24, 100, true}, Shape{5, 16, 13, true}}) {
    for (ElementType type : {ElementType::f32, ElementType::bf16, ElementType::f16}) {
      std::ostringstream what;
      what << "linear_gelu rows " << s.rows << " C " << s.hidden << " F " << s.features
           << (s.bias ? " with bias" : " without bias");
      const int64_t rows = s.rows, C = s.hidden, F = s.features;
      const auto x = representable(random_values(rows * C, 11), type);
      const auto w1 = representable(random_values(F * C, 12, 0.1f), type);
      const auto b1 = representable(random_values(F, 13), type);
      const auto w2 = representable(random_values(C * F, 14, 0.1f), type);
      const auto dy = representable(random_values(rows * C, 15), type);
      const auto dw0 = random_values(C * F, 16);
      const auto db0 = random_values(C, 17);
      // GELU inside the epilogue starts from the fp32 accumulator, the CPU from h rounded to
      // the element type: one rounding of its input more than the other 16-bit ops.
      check_against_cpu(
          *gpu, what.str(), type, tolerance(type, 5e-5), [&](Tensors& t, ElementType dtype) {
            Device& device = t.device();
            View h = t.poisoned(rows * F, dtype);
            View a = t.poisoned(rows * F, dtype);
            ops::linear_gelu_forward(device, a, h, t.input(x, dtype), t.input(w1, dtype),
                                     s.bias ? t.input(b1, dtype) : t.empty(dtype), rows, C, F);
            View dh = t.poisoned(rows * F, dtype);
            View dw = t.input(dw0, ElementType::f32);
            View db = t.input(db0, ElementType::f32);
            ops::linear_dgelu_backward(device, dh, dw, db, t.input(dy, dtype), a,
                                       t.input(w2, dtype), h, rows, F, C);
            return Outputs{{"activation", t.read(a)},
                           {"preactivation", t.read(h)},
                           {"dpreactivation", t.read(dh)},
                           {"dweight (+=)", t.read(dw)},
                           {"dbias (+=)", t.read(db)}};
          });
    }
  }
}

// --gemm-autotune (device/gemm_plans.cuh): a device that times each shape's candidates keeps
// only those with the heuristic's bits, so its products (plain, accumulating, with the GELU
// epilogues) are a plain device's, bit for bit, at the tuning call and after it.
TEST_CASE("--gemm-autotune gives the heuristic's bits") {
  auto plain = open_gpu_or_skip();
  if (!plain) return;
  auto tuned = open_gpu_or_skip(false, {.gemm_autotune = true});
  const int64_t rows = 512, C = 768, F = 3072;
  const ElementType type = ElementType::bf16;
  const auto x = representable(random_values(rows * C, 21), type);
  const auto w1 = representable(random_values(F * C, 22, 0.05f), type);
  const auto b1 = representable(random_values(F, 23), type);
  const auto w2 = representable(random_values(C * F, 24, 0.05f), type);
  const auto dy = representable(random_values(rows * C, 25), type);
  const auto dw0 = random_values(C * F, 26);
  const auto run = [&](Device& device) {
    Tensors t(device);
    Outputs outputs;
    for (int call = 0; call < 2; ++call) {  // the tuning call, then the tuned algorithm
      View h = t.poisoned(rows * F, type);
      View a = t.poisoned(rows * F, type);
      ops::linear_gelu_forward(device, a, h, t.input(x, type), t.input(w1, type), t.input(b1, type),
                               rows, C, F);
      View y = t.poisoned(rows * C, type);
      ops::linear_forward(device, y, a, t.input(w2, type), t.empty(type), rows, F, C);
      View dh = t.poisoned(rows * F, type);
      View dw = t.input(dw0, ElementType::f32);
      View db = t.input(random_values(C, 27), ElementType::f32);
      ops::linear_dgelu_backward(device, dh, dw, db, t.input(dy, type), a, t.input(w2, type), h,
                                 rows, F, C);
      for (const auto& [name, view] :
           {std::pair{"activation", a}, std::pair{"preactivation", h}, std::pair{"output", y},
            std::pair{"dpreactivation", dh}, std::pair{"dweight (+=)", dw}}) {
        outputs.push_back({std::string(name) + " call " + std::to_string(call), t.read(view)});
      }
    }
    return outputs;
  };
  const Outputs expected = run(*plain);
  const Outputs actual = run(*tuned);
  REQUIRE(actual.size() == expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    CAPTURE(expected[i].first);
    expect_identical(expected[i].first, actual[i].second, expected[i].second);
  }
}
