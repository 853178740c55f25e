// linear_forward / linear_backward on the CUDA device (cuBLASLt) against the CPU device, fp32,
// bf16 and fp16, with and without bias, awkward shapes (1 row, widths that are not multiples of
// 8), parameter gradients accumulating (+=, started from non-zero values), run to run identical.
#include <doctest/doctest.h>

#include <cstdint>
#include <sstream>
#include <string>

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
