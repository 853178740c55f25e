// Megatron's FLOP formula, the warm-up-free median, and the JSON file benchmark mode writes.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "backend/train/log/benchmark_report.hpp"

using namespace backend;

TEST_CASE("FLOPs per iteration follow Megatron's num_floating_point_operations") {
  LoggedRun a;
  a.model.num_layers = 12;
  a.model.hidden_size = 768;
  a.model.ffn_hidden_size = 3072;
  a.model.seq_length = 256;
  a.global_batch_size = 8;
  // The reduced form for MHA with ffn = 4h: 72·B·s·L·h²·(1 + s/(12h)) + 6·B·s·h·V.
  const double B = 8, s = 256, L = 12, h = 768, V = 50304;
  const double expected = 72 * B * s * L * h * h * (1 + s / (12 * h)) + 6 * B * s * h * V;
  CHECK(megatron_flops_per_iteration(a.model, a.global_batch_size, 50304) ==
        doctest::Approx(expected).epsilon(1e-12));
}

TEST_CASE("SwiGLU adds a third h × ffn matrix to the MLP's FLOPs") {
  LoggedRun a;
  a.model.num_layers = 4;
  a.model.hidden_size = 256;
  a.model.ffn_hidden_size = 688;
  a.model.seq_length = 128;
  a.global_batch_size = 2;
  const double gelu = megatron_flops_per_iteration(a.model, a.global_batch_size, 32000);
  a.model.swiglu = true;
  // Forward 2 FLOPs per multiply-add, backward twice the forward: 6 per weight per token.
  const double extra_matrix = 6.0 * 2 * 128 * 4 * 256 * 688;
  CHECK(megatron_flops_per_iteration(a.model, a.global_batch_size, 32000) - gelu ==
        doctest::Approx(extra_matrix).epsilon(1e-12));
}

TEST_CASE("grouped-query attention removes the key and value weights of the missing groups") {
  LoggedRun a;
  a.model.num_layers = 4;
  a.model.hidden_size = 512;
  a.model.num_attention_heads = 32;
  a.model.ffn_hidden_size = 1376;
  a.model.seq_length = 128;
  a.global_batch_size = 2;
  const double multi_head = megatron_flops_per_iteration(a.model, a.global_batch_size, 32000);
  a.model.group_query_attention = true;
  a.model.num_query_groups = 8;
  // linear_qkv's key and value rows shrink from 2h to 2h · 8/32: 6 FLOPs per weight per token.
  const double removed_weights = 2.0 * 512 * 512 * (1 - 8.0 / 32);
  CHECK(multi_head - megatron_flops_per_iteration(a.model, a.global_batch_size, 32000) ==
        doctest::Approx(6.0 * 2 * 128 * 4 * removed_weights).epsilon(1e-12));
}

TEST_CASE("the median leaves the warm-up iteration out and the JSON holds every field") {
  LoggedRun a;
  a.model.num_layers = 2;
  a.model.hidden_size = 64;
  a.model.ffn_hidden_size = 256;
  a.model.seq_length = 32;
  a.micro_batch_size = 2;
  a.global_batch_size = 4;
  a.padded_vocab_size = 128;
  const auto summary = summarize_benchmark(a, {5000.0, 10.0, 30.0, 20.0}, 1e11);
  CHECK(summary.median_step_ms == doctest::Approx(20.0));
  CHECK(summary.iterations_measured == 3);
  CHECK(summary.tokens_per_second == doctest::Approx(4 * 32 / 0.020));
  CHECK(summary.mfu == doctest::Approx(summary.tflops_per_device * 1e12 / 1e11));
  CHECK(summary.peak_memory_bytes > 0);

  const auto file = std::filesystem::temp_directory_path() / "benchmark_report_test" / "b.json";
  write_benchmark_json(file, a, 12345, summary);
  std::ifstream in(file);
  const auto report = nlohmann::json::parse(in);
  CHECK(report.at("median_step_ms").get<double>() == doctest::Approx(20.0));
  CHECK(report.at("model").at("parameters").get<int64_t>() == 12345);
  CHECK(report.at("parallel").at("data_parallel_size").get<int64_t>() == 1);

  // Four ranks (TP=2 × DP=2): the same step shares its FLOPs over four devices, and the JSON
  // says so (it reported world size 1 and the whole step's FLOPs per device before).
  LoggedRun four = a;
  four.parallelism.world_size = 4;
  four.parallelism.tensor_model_parallel_size = 2;
  const auto shared = summarize_benchmark(four, {5000.0, 10.0, 30.0, 20.0}, 1e11);
  CHECK(shared.tflops_per_device == doctest::Approx(summary.tflops_per_device / 4));
  write_benchmark_json(file, four, 12345, shared);
  std::ifstream four_in(file);
  const auto four_report = nlohmann::json::parse(four_in);
  CHECK(four_report.at("parallel").at("world_size").get<int64_t>() == 4);
  CHECK(four_report.at("parallel").at("data_parallel_size").get<int64_t>() == 2);
  for (const char* key : {"tokens_per_second", "tflops_per_device", "mfu", "peak_memory_bytes",
                          "peak_tflops_measured", "device", "precision"}) {
    CAPTURE(key);
    CHECK(report.contains(key));
  }
  std::filesystem::remove_all(file.parent_path());
}

TEST_CASE("--log-throughput's TFLOP/s/GPU: Megatron's FLOPs of the current batch over the time") {
  LoggedRun a;
  a.model.num_layers = 12;
  a.model.hidden_size = 768;
  a.model.ffn_hidden_size = 3072;
  a.model.seq_length = 256;
  a.global_batch_size = 8;
  // A ramp-up iteration of 2 samples taking 0.5 s, on 1 and on 4 GPUs.
  const double B = 2, s = 256, L = 12, h = 768, V = 50304;
  const double flops = 72 * B * s * L * h * h * (1 + s / (12 * h)) + 6 * B * s * h * V;
  a.padded_vocab_size = 50304;
  CHECK(megatron_throughput_tflops_per_gpu(a, 2, 0.5) ==
        doctest::Approx(flops / 0.5 / 1e12).epsilon(1e-12));
  a.parallelism.world_size = 4;
  CHECK(megatron_throughput_tflops_per_gpu(a, 2, 0.5) ==
        doctest::Approx(flops / 0.5 / 1e12 / 4).epsilon(1e-12));
}
