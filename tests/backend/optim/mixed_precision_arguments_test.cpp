// Which loss scaler the mixed-precision flags give, as Megatron's get_megatron_optimizer builds
// its grad scaler.
#include "backend/optim/mixed_precision_arguments.hpp"

#include <doctest/doctest.h>

using backend::LossScaler;
using backend::make_loss_scaler;
using backend::MixedPrecisionArguments;

TEST_CASE("fp32 and bf16 without --loss-scale: no scaler, scale 1.0") {
  MixedPrecisionArguments fp32;
  CHECK(make_loss_scaler(fp32).kind() == LossScaler::Kind::none);
  CHECK(make_loss_scaler(fp32).scale() == 1.0);
  fp32.loss_scale = 1024;  // Megatron's fp32 optimizer has no scaler: ignored
  CHECK(make_loss_scaler(fp32).kind() == LossScaler::Kind::none);
  MixedPrecisionArguments bf16;
  bf16.bf16 = true;
  CHECK(make_loss_scaler(bf16).kind() == LossScaler::Kind::none);
}

TEST_CASE("--loss-scale with --fp16 or --bf16: a constant scaler") {
  for (bool fp16 : {true, false}) {
    CAPTURE(fp16);
    MixedPrecisionArguments a;
    a.fp16 = fp16;
    a.bf16 = !fp16;
    a.loss_scale = 4096;
    LossScaler scaler = make_loss_scaler(a);
    CHECK(scaler.kind() == LossScaler::Kind::constant);
    scaler.update(true);
    scaler.update(true);
    CHECK(scaler.scale() == 4096);
  }
}

TEST_CASE("--fp16 alone: Megatron's dynamic scaler from the flags, growth 2, backoff 0.5") {
  MixedPrecisionArguments a;
  a.fp16 = true;
  LossScaler defaults = make_loss_scaler(a);
  CHECK(defaults.dynamic());
  CHECK(defaults.state() == LossScaler::State{4294967296.0, 0, 2});

  a.initial_loss_scale = 64;
  a.min_loss_scale = 16;
  a.loss_scale_window = 2;
  a.hysteresis = 1;
  LossScaler scaler = make_loss_scaler(a);
  CHECK(scaler.state() == LossScaler::State{64, 0, 1});
  scaler.update(true);  // hysteresis 1: halves at once
  CHECK(scaler.scale() == 32);
  scaler.update(true);
  scaler.update(true);  // floor 16
  CHECK(scaler.scale() == 16);
  scaler.update(false);
  scaler.update(false);  // window 2: doubles
  CHECK(scaler.state() == LossScaler::State{32, 0, 1});
}
