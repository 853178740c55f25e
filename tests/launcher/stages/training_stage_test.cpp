// NeMo training config → Megatron flags, on the real conf/ tree, and the docs table in step.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "backend/common/error.hpp"
#include "backend/common/flag_rules.hpp"
#include "launcher/clusters/cluster.hpp"
#include "launcher/config/compose.hpp"
#include "launcher/config/interpolate.hpp"
#include "launcher/config/yaml_io.hpp"
#include "launcher/stages/command_flags.hpp"
#include "launcher/stages/training_stage.hpp"

using namespace launcher;

namespace {

using test_support::flag_value;
using test_support::has;

Node composed_126m(std::vector<std::string> overrides) {
  overrides.insert(overrides.begin(), "training=gpt3/126m");
  overrides.push_back("launcher_scripts_path=/opt/launcher");
  ComposedConfig composed = compose({std::string(TEST_SOURCE_DIR) + "/conf", "config", overrides});
  return resolve(composed.config, ResolveContext{composed.choices});
}

}  // namespace

TEST_CASE("gpt3/126m translates to Megatron's flags with NeMo's values") {
  const auto arguments = megatron_training_arguments(composed_126m({}));
  CHECK(flag_value(arguments, "--num-layers") == "12");
  CHECK(flag_value(arguments, "--hidden-size") == "768");
  CHECK(flag_value(arguments, "--ffn-hidden-size") == "3072");  // ${multiply:4, ${.hidden_size}}
  CHECK(flag_value(arguments, "--num-attention-heads") == "12");
  CHECK(flag_value(arguments, "--seq-length") == "2048");
  CHECK(flag_value(arguments, "--max-position-embeddings") == "2048");
  CHECK(flag_value(arguments, "--micro-batch-size") == "4");
  CHECK(flag_value(arguments, "--global-batch-size") == "256");
  CHECK(flag_value(arguments, "--lr") == "0.0006");
  CHECK(flag_value(arguments, "--min-lr") == "6e-05");
  CHECK(flag_value(arguments, "--adam-beta2") == "0.95");
  CHECK(flag_value(arguments, "--lr-decay-style") == "cosine");
  CHECK(flag_value(arguments, "--lr-warmup-iters") == "636");
  CHECK(flag_value(arguments, "--lr-decay-iters") == "500000");  // 600000 − constant_steps
  CHECK(flag_value(arguments, "--vocab-file") == "/opt/launcher/data/bpe/vocab.json");
  CHECK(has(arguments, "--bf16"));
  CHECK(has(arguments, "--mock-data"));
  CHECK(has(arguments, "--use-distributed-optimizer"));  // optim.name: distributed_fused_adam
  CHECK_FALSE(has(arguments, "--sequence-parallel"));    // not set in the shipped config
}

TEST_CASE("short runs keep Megatron's warmup < decay while the rate that runs stays NeMo's") {
  const auto arguments = megatron_training_arguments(composed_126m({"training.trainer.max_steps=3"}));
  CHECK(flag_value(arguments, "--train-iters") == "3");
  CHECK(flag_value(arguments, "--lr-decay-iters") == "637");
}

TEST_CASE("precision, scheduler names and data_impl are translated or refused by name") {
  CHECK_FALSE(has(megatron_training_arguments(composed_126m({"training.trainer.precision=32"})),
                  "--bf16"));
  CHECK(has(megatron_training_arguments(composed_126m({"training.trainer.precision=16-mixed"})),
            "--fp16"));
  CHECK_THROWS_WITH_AS(
      megatron_training_arguments(composed_126m({"training.trainer.precision=fp8"})),
      doctest::Contains("training.trainer.precision 'fp8' is not valid"), common::Error);
  CHECK_THROWS_WITH_AS(
      megatron_training_arguments(composed_126m({"training.model.optim.sched.name=Noam"})),
      doctest::Contains("'Noam' has no Megatron equivalent"), common::Error);
  CHECK_THROWS_WITH_AS(
      megatron_training_arguments(composed_126m({"training.model.data.data_impl=mmap"})),
      doctest::Contains("training.model.data.data_prefix is empty"), common::Error);
  const auto real_data = megatron_training_arguments(composed_126m(
      {"training.model.data.data_impl=mmap", "training.model.data.data_prefix=[0.3,a,0.7,b]"}));
  CHECK(flag_value(real_data, "--data-path") == "0.3");
  CHECK(flag_value(real_data, "--split") == "99990,8,2");
  CHECK_FALSE(has(real_data, "--mock-data"));
  CHECK_FALSE(has(real_data, "--data-cache-path"));  // null: the backend caches next to the data
  const auto cached = megatron_training_arguments(composed_126m(
      {"training.model.data.data_impl=mmap", "training.model.data.data_prefix=[/data/a]",
       "training.model.data.index_mapping_dir=/scratch/index"}));
  CHECK(flag_value(cached, "--data-path") == "/data/a");
  CHECK(flag_value(cached, "--data-cache-path") == "/scratch/index");
}

TEST_CASE("NeMo's per-split data_prefix becomes Megatron's per-split blends, splits_string left out") {
  const std::vector<std::string> per_split = {
      "training.model.data.data_impl=mmap",
      "training.model.data.data_prefix={train:[0.6,/data/a,0.4,/data/b],validation:[/data/v],"
      "test:/data/t}"};
  const auto arguments = megatron_training_arguments(composed_126m(per_split));
  const auto after = [&](const std::string& flag, size_t count) {
    const auto at = std::find(arguments.begin(), arguments.end(), flag);
    REQUIRE(at != arguments.end());
    REQUIRE(std::distance(at, arguments.end()) > static_cast<std::ptrdiff_t>(count));
    return std::vector<std::string>(at + 1, at + 1 + static_cast<std::ptrdiff_t>(count));
  };
  CHECK(after("--train-data-path", 4) ==
        std::vector<std::string>{"0.6", "/data/a", "0.4", "/data/b"});
  CHECK(after("--valid-data-path", 1) == std::vector<std::string>{"/data/v"});
  CHECK(after("--test-data-path", 1) == std::vector<std::string>{"/data/t"});
  CHECK_FALSE(has(arguments, "--data-path"));
  CHECK_FALSE(has(arguments, "--split"));

  CHECK_THROWS_WITH_AS(
      megatron_training_arguments(composed_126m(
          {"training.model.data.data_impl=mmap",
           "training.model.data.data_prefix={train:[/data/a],validation:[/data/v]}"})),
      doctest::Contains("training.model.data.data_prefix has no 'test' key"), common::Error);
  CHECK_THROWS_WITH_AS(
      megatron_training_arguments(composed_126m(
          {"training.model.data.data_impl=mmap",
           "training.model.data.data_prefix={train:[/data/a],valid:[/data/v],test:[/data/t]}"})),
      doctest::Contains("training.model.data.data_prefix.valid is not a split (valid keys: train, "
                        "validation, test)"),
      common::Error);
  CHECK_THROWS_WITH_AS(
      megatron_training_arguments(composed_126m(
          {"training.model.data.data_impl=mmap",
           "training.model.data.data_prefix={train:[],validation:[/data/v],test:[/data/t]}"})),
      doctest::Contains("training.model.data.data_prefix.train is empty"), common::Error);
}

TEST_CASE("model.use_flash_attention true becomes --use-flash-attn, false and absent give none") {
  // NeMo's llama2 configs set it true; gpt3/126m leaves it out (NeMo's default false).
  CHECK_FALSE(has(megatron_training_arguments(composed_126m({})), "--use-flash-attn"));
  CHECK(has(megatron_training_arguments(
                composed_126m({"++training.model.use_flash_attention=true"})),
            "--use-flash-attn"));
  CHECK_FALSE(has(megatron_training_arguments(
                      composed_126m({"++training.model.use_flash_attention=false"})),
                  "--use-flash-attn"));
  CHECK_THROWS_WITH_AS(megatron_training_arguments(
                           composed_126m({"++training.model.use_flash_attention=sometimes"})),
                       doctest::Contains("training.model.use_flash_attention"),
                       common::Error);
}

TEST_CASE("model.data.eod_mask_loss true becomes --eod-mask-loss, false, null and absent give none") {
  CHECK_FALSE(has(megatron_training_arguments(composed_126m({})), "--eod-mask-loss"));
  CHECK(has(megatron_training_arguments(composed_126m({"++training.model.data.eod_mask_loss=true"})),
            "--eod-mask-loss"));
  for (const std::string off : {"false", "null"}) {
    CAPTURE(off);
    CHECK_FALSE(has(megatron_training_arguments(
                        composed_126m({"++training.model.data.eod_mask_loss=" + off})),
                    "--eod-mask-loss"));
  }
  CHECK_THROWS_WITH_AS(megatron_training_arguments(
                           composed_126m({"++training.model.data.eod_mask_loss=sometimes"})),
                       doctest::Contains("training.model.data.eod_mask_loss"), common::Error);
}

TEST_CASE("model.sequence_parallel true becomes --sequence-parallel, whatever the tp size") {
  // NeMo's conf trees set the key (gpt3/5b: true, tp 2); the shipped 126m leaves it out.
  const auto tensor_parallel = megatron_training_arguments(composed_126m(
      {"++training.model.sequence_parallel=true", "training.model.tensor_model_parallel_size=2"}));
  CHECK(has(tensor_parallel, "--sequence-parallel"));
  CHECK(flag_value(tensor_parallel, "--tensor-model-parallel-size") == "2");
  // At tp 1 it is passed too: pretrain_gpt, as Megatron, switches it off itself.
  CHECK(has(megatron_training_arguments(composed_126m({"++training.model.sequence_parallel=true"})),
            "--sequence-parallel"));
  CHECK_FALSE(has(
      megatron_training_arguments(composed_126m({"++training.model.sequence_parallel=false",
                                                 "training.model.tensor_model_parallel_size=2"})),
      "--sequence-parallel"));
  CHECK_FALSE(
      has(megatron_training_arguments(composed_126m({"++training.model.sequence_parallel=null"})),
          "--sequence-parallel"));
  const JobSpec job = build_training_job(
      {composed_126m({"++training.model.sequence_parallel=true", "training.trainer.devices=2",
                      "training.model.tensor_model_parallel_size=2"}),
       "/bin", ""});
  CHECK(has(job.command, "--sequence-parallel"));
  CHECK_THROWS_WITH_AS(
      megatron_training_arguments(composed_126m({"++training.model.sequence_parallel=yes please"})),
      doctest::Contains("training.model.sequence_parallel"), common::Error);
}

TEST_CASE("model.optim.name: distributed_fused_adam becomes --use-distributed-optimizer") {
  CHECK(has(megatron_training_arguments(
                composed_126m({"training.model.optim.name=distributed_fused_adam"})),
            "--use-distributed-optimizer"));
  for (const std::string name : {"fused_adam", "adam", "adamw"}) {
    CAPTURE(name);
    const auto arguments =
        megatron_training_arguments(composed_126m({"training.model.optim.name=" + name}));
    CHECK_FALSE(has(arguments, "--use-distributed-optimizer"));
    CHECK(flag_value(arguments, "--lr") == "0.0006");  // the rest of optim is unchanged
  }
  // No name (null): Megatron's default optimizer, not the distributed one.
  CHECK_FALSE(has(megatron_training_arguments(composed_126m({"training.model.optim.name=null"})),
                  "--use-distributed-optimizer"));
}

TEST_CASE("an unknown optimizer name is refused, naming the key and the valid names") {
  for (const std::string name : {"sgd", "novograd", "Adam", "distributed-fused-adam"}) {
    CAPTURE(name);
    const Node config = composed_126m({"training.model.optim.name=" + name});
    CHECK_THROWS_WITH_AS(
        megatron_training_arguments(config),
        doctest::Contains(("training.model.optim.name: '" + name +
                           "' is not an optimizer pretrain_gpt trains (valid: fused_adam, adam, "
                           "adamw, distributed_fused_adam) (from the command line)")
                              .c_str()),
        common::Error);
    const auto problems = training_value_problems(config);
    REQUIRE(problems.size() == 1);
    CHECK(problems.front().find("training.model.optim.name") != std::string::npos);
  }
  // Reported with the other bad values at once.
  const auto problems = training_value_problems(
      composed_126m({"training.model.optim.name=sgd", "training.model.optim.lr=abc"}));
  CHECK(problems.size() == 2);
  // Not a name at all.
  CHECK_THROWS_WITH_AS(
      megatron_training_arguments(composed_126m({"training.model.optim.name={a: 1}"})),
      doctest::Contains("training.model.optim.name"), common::Error);
}

TEST_CASE("virtual_pipeline_model_parallel_size V becomes layers per chunk: L / (pp × V)") {
  const std::vector<std::string> interleaved = {
      "training.trainer.devices=4", "training.model.num_layers=24",
      "training.model.pipeline_model_parallel_size=4",
      "+training.model.virtual_pipeline_model_parallel_size=3"};
  const auto arguments = megatron_training_arguments(composed_126m(interleaved));
  CHECK(flag_value(arguments, "--num-layers-per-virtual-pipeline-stage") == "2");  // 24 / (4 × 3)
  CHECK(flag_value(arguments, "--pipeline-model-parallel-size") == "4");
  // NeMo's model.overlap_p2p_comm: absent or false (its default) keeps each batch of pipeline
  // transfers blocking, true lets them travel during the computes (Megatron-LM's default).
  CHECK(has(arguments, "--no-overlap-p2p-communication"));
  for (const std::string overlap : {"false", "null"}) {
    auto with_key = interleaved;
    with_key.push_back("training.model.overlap_p2p_comm=" + overlap);
    CHECK(has(megatron_training_arguments(composed_126m(with_key)),
              "--no-overlap-p2p-communication"));
  }
  auto overlapped = interleaved;
  overlapped.push_back("training.model.overlap_p2p_comm=true");
  CHECK_FALSE(has(megatron_training_arguments(composed_126m(overlapped)),
                  "--no-overlap-p2p-communication"));
  // Without interleaving the key changes nothing (NeMo and Megatron ignore it there).
  CHECK_FALSE(
      has(megatron_training_arguments(composed_126m({"training.model.overlap_p2p_comm=false"})),
          "--no-overlap-p2p-communication"));
  CHECK_THROWS_WITH_AS(megatron_training_arguments(composed_126m([&] {
                         auto bad = interleaved;
                         bad.push_back("training.model.overlap_p2p_comm=sometimes");
                         return bad;
                       }())),
                       doctest::Contains("training.model.overlap_p2p_comm"), common::Error);
  // A quoted value is read as any flag's value is.
  const auto quoted = megatron_training_arguments(composed_126m(
      {"training.model.num_layers=24", "training.model.pipeline_model_parallel_size=4",
       "+training.model.virtual_pipeline_model_parallel_size='3'"}));
  CHECK(flag_value(quoted, "--num-layers-per-virtual-pipeline-stage") == "2");

  // In the job's command and in the script rendered from it, as flag and value side by side.
  const JobSpec job = build_training_job({composed_126m(interleaved), "/opt/bin", ""});
  const auto at = std::find(job.command.begin(), job.command.end(),
                            "--num-layers-per-virtual-pipeline-stage");
  REQUIRE(std::distance(at, job.command.end()) >= 2);
  CHECK(*(at + 1) == "2");
  const Node cluster = parse_yaml("job_name_prefix: ''\n", "test");
  const std::filesystem::path templates = std::filesystem::path(TEST_SOURCE_DIR) / "templates";
  const std::string script =
      render_local_script(job, "/tmp/results/x.sh", {templates, &cluster, "", {}});
  CHECK(script.find("\n    --num-layers-per-virtual-pipeline-stage 2 \\\n") != std::string::npos);

  // Null, absent or 1 (one chunk per stage, NeMo's "no interleaving"): no flag.
  for (const std::string chunks : {"null", "1"}) {
    CAPTURE(chunks);
    const auto arguments = megatron_training_arguments(composed_126m(
        {"training.model.num_layers=24", "training.model.pipeline_model_parallel_size=4",
         "+training.model.virtual_pipeline_model_parallel_size=" + chunks}));
    CHECK_FALSE(has(arguments, "--num-layers-per-virtual-pipeline-stage"));
  }
  CHECK_FALSE(has(megatron_training_arguments(composed_126m({})),
                  "--num-layers-per-virtual-pipeline-stage"));
  // V = 1 renders whatever pp is: it asks for nothing Megatron could refuse.
  CHECK_FALSE(has(megatron_training_arguments(composed_126m(
                      {"+training.model.virtual_pipeline_model_parallel_size=1"})),
                  "--num-layers-per-virtual-pipeline-stage"));
}

TEST_CASE("a virtual_pipeline_model_parallel_size that is not an integer ≥ 1, or does not divide "
          "the layers, is refused, naming the keys") {
  const std::string valid =
      "training.model.virtual_pipeline_model_parallel_size takes an integer ≥ 1 (the model chunks "
      "per pipeline stage; null or 1: no interleaving) (from the command line)";
  struct Case {
    std::string value;
    std::string problem;
  };
  for (const Case& c : std::vector<Case>{{"0", "'0' is out of range"},
                                         {"-2", "'-2' is out of range"},
                                         {"abc", "'abc' is not an integer"},
                                         {"1.5", "'1.5' is not an integer"},
                                         {"true", "'true' is not an integer"}}) {
    CAPTURE(c.value);
    const Node config = composed_126m(
        {"training.model.num_layers=24", "training.model.pipeline_model_parallel_size=4",
         "+training.model.virtual_pipeline_model_parallel_size=" + c.value});
    const std::string message =
        "training.model.virtual_pipeline_model_parallel_size: " + c.problem + "; " + valid;
    CHECK_THROWS_WITH_AS(megatron_training_arguments(config), doctest::Contains(message.c_str()),
                         common::Error);
    const auto problems = training_value_problems(config);
    REQUIRE(problems.size() == 1);
    CHECK(problems.front() == message);
  }
  // A list is not a value at all.
  CHECK_THROWS_WITH_AS(
      megatron_training_arguments(composed_126m(
          {"+training.model.virtual_pipeline_model_parallel_size=[2,3]"})),
      doctest::Contains(
          "training.model.virtual_pipeline_model_parallel_size: expected a single value"),
      common::Error);
  // 24 layers do not split into 4 × 5 chunks: there is no whole number of layers to pass.
  CHECK_THROWS_WITH_AS(
      megatron_training_arguments(composed_126m(
          {"training.model.num_layers=24", "training.model.pipeline_model_parallel_size=4",
           "+training.model.virtual_pipeline_model_parallel_size=5"})),
      doctest::Contains("training.model.num_layers 24 is not divisible by "
                        "pipeline_model_parallel_size 4 × virtual_pipeline_model_parallel_size 5 "
                        "= 20 (every model chunk holds the same number of layers)"),
      common::Error);
}

TEST_CASE("the training job takes its nodes and tasks from the trainer") {
  const Node sixteen = composed_126m({"training.trainer.num_nodes=2", "training.trainer.devices=8"});
  const JobSpec multi_node = build_training_job({sixteen, "/bin", ""});
  CHECK(multi_node.nodes == 2);
  CHECK(multi_node.tasks_per_node == 8);
  const Node config = composed_126m({});
  const JobSpec job = build_training_job({config, "/opt/bin", "nemo-"});
  CHECK(job.job_name == "nemo-gpt3_126m");
  CHECK(job.command.front() == "/opt/bin/pretrain_gpt");
  CHECK(job.time_limit == "1-00:00:00");
  CHECK(job.run_dependency == "singleton");
  CHECK(job.tool == "pretrain_gpt");
  CHECK(job.environment.empty());
  const JobSpec tensor_parallel = build_training_job(
      {composed_126m({"training.trainer.devices=2", "training.model.tensor_model_parallel_size=2"}),
       "/bin", ""});
  CHECK(tensor_parallel.environment ==
        std::vector<std::pair<std::string, std::string>>{{"CUDA_DEVICE_MAX_CONNECTIONS", "1"}});
}

TEST_CASE("docs/launcher.md lists every row of the flag table") {
  std::ifstream file(std::string(TEST_SOURCE_DIR) + "/docs/launcher.md");
  REQUIRE(file);
  std::stringstream text;
  text << file.rdbuf();
  for (const auto& row : training_flag_table()) {
    CAPTURE(row.config_key);
    CHECK(text.str().find("| `" + row.config_key + "` | `" + row.flag + "` |") != std::string::npos);
  }
}

TEST_CASE("the log dir goes to --log-dir and, unless disabled, --tensorboard-dir") {
  const auto arguments = megatron_training_arguments(composed_126m({"base_results_dir=/r"}));
  CHECK(flag_value(arguments, "--log-dir") == "/r/gpt3_126m/results");  // explicit_log_dir
  CHECK(flag_value(arguments, "--tensorboard-dir") == "/r/gpt3_126m/results");
  CHECK_FALSE(has(arguments, "--benchmark-output"));
  const auto without = megatron_training_arguments(
      composed_126m({"+training.exp_manager.create_tensorboard_logger=false"}));
  CHECK_FALSE(has(without, "--tensorboard-dir"));
  CHECK(has(without, "--log-dir"));
  const auto benchmark = megatron_training_arguments(composed_126m(
      {"base_results_dir=/r", "training.trainer.limit_val_batches=0"}));
  CHECK(flag_value(benchmark, "--benchmark-output") == "/r/gpt3_126m/results/benchmark.json");
}

TEST_CASE("trainer.limit_val_batches: Lightning's integer and float forms") {
  CHECK(flag_value(megatron_training_arguments(composed_126m({"training.trainer.limit_val_batches=7"})),
                   "--eval-iters") == "7");
  // A float is a fraction of the validation batches: 0.0 is none, as Lightning reads it.
  const auto none = megatron_training_arguments(composed_126m(
      {"base_results_dir=/r", "training.trainer.limit_val_batches=0.0",
       "training.model.data.data_impl=mock"}));
  CHECK(flag_value(none, "--eval-iters") == "0");
  CHECK(flag_value(none, "--benchmark-output") == "/r/gpt3_126m/results/benchmark.json");
  CHECK_FALSE(has(megatron_training_arguments(composed_126m({"training.trainer.limit_val_batches=null"})),
                  "--eval-iters"));
  // Other fractions cannot be counted before the data is read; above 1.0 NeMo refuses them.
  for (const std::string value : {"0.5", "1.0", "5.0", "-0.5"}) {
    CAPTURE(value);
    const auto problems = training_value_problems(
        composed_126m({"training.trainer.limit_val_batches=" + value}));
    REQUIRE(problems.size() == 1);
    CHECK(problems.front().starts_with("training.trainer.limit_val_batches " + value + ": a float is "));
    CHECK(problems.front().find("give a number of batches") != std::string::npos);
    CHECK(problems.front().find("or 0.0 (or 0) for no validation") != std::string::npos);
  }
  CHECK(training_value_problems(composed_126m({"training.trainer.limit_val_batches=1.0"})).front().find(
            "cannot be counted before pretrain_gpt reads the data") != std::string::npos);
  CHECK(training_value_problems(composed_126m({"training.trainer.limit_val_batches=5.0"})).front().find(
            "less than or equal to 1.0") != std::string::npos);
  const auto text = training_value_problems(composed_126m({"training.trainer.limit_val_batches=x"}));
  REQUIRE(text.size() == 1);
  CHECK(text.front().starts_with("training.trainer.limit_val_batches: 'x' is not an integer"));
  CHECK_THROWS_WITH_AS(megatron_training_arguments(composed_126m({"training.trainer.limit_val_batches=0.25"})),
                       doctest::Contains("training.trainer.limit_val_batches 0.25: a float is"),
                       common::Error);
}

TEST_CASE("exp_manager's checkpoint keys become --save, --save-interval and --load") {
  // NeMo's defaults in gpt3/126m: a checkpoint callback, resume_if_exists, saves at validation.
  const Node config = composed_126m({"base_results_dir=/results"});
  const auto arguments = megatron_training_arguments(config);
  const std::string checkpoints = "/results/gpt3_126m/results/checkpoints";  // explicit_log_dir
  CHECK(flag_value(arguments, "--save") == checkpoints);
  CHECK(flag_value(arguments, "--load") == checkpoints);
  CHECK(flag_value(arguments, "--save-interval") == "2000");  // trainer.val_check_interval
  CHECK(has(arguments, "--use-checkpoint-opt_param-scheduler"));

  const auto every_100 = megatron_training_arguments(composed_126m(
      {"training.exp_manager.checkpoint_callback_params.every_n_train_steps=100"}));
  CHECK(flag_value(every_100, "--save-interval") == "100");

  const auto elsewhere = megatron_training_arguments(
      composed_126m({"training.exp_manager.explicit_log_dir=/scratch/logs"}));
  CHECK(flag_value(elsewhere, "--save") == "/scratch/logs/checkpoints");

  const auto no_resume =
      megatron_training_arguments(composed_126m({"training.exp_manager.resume_if_exists=false"}));
  CHECK(has(no_resume, "--save"));
  CHECK_FALSE(has(no_resume, "--load"));
  CHECK_FALSE(has(no_resume, "--use-checkpoint-opt_param-scheduler"));

  const auto no_callback = megatron_training_arguments(composed_126m(
      {"training.exp_manager.create_checkpoint_callback=false",
       "training.exp_manager.resume_if_exists=false"}));
  CHECK_FALSE(has(no_callback, "--save"));
  CHECK_FALSE(has(no_callback, "--save-interval"));
  CHECK_FALSE(has(no_callback, "--load"));

  CHECK_THROWS_WITH_AS(
      megatron_training_arguments(composed_126m(
          {"training.exp_manager.checkpoint_callback_params.every_n_train_steps=often"})),
      doctest::Contains("training.exp_manager.checkpoint_callback_params.every_n_train_steps"),
      common::Error);
}

TEST_CASE("model.restore_from_path becomes --pretrained-checkpoint, a .nemo file is refused") {
  const auto none = megatron_training_arguments(composed_126m({}));
  CHECK_FALSE(has(none, "--pretrained-checkpoint"));
  const auto explicit_null = megatron_training_arguments(
      composed_126m({"++training.model.restore_from_path=null"}));
  CHECK_FALSE(has(explicit_null, "--pretrained-checkpoint"));

  // Beside the run's own --load: a restarted job resumes its checkpoints, the first starts from
  // the pretrained weights (pretrain_gpt decides at start-up).
  const auto arguments = megatron_training_arguments(
      composed_126m({"base_results_dir=/results", "++training.model.restore_from_path=/models/llama_imported"}));
  CHECK(flag_value(arguments, "--pretrained-checkpoint") == "/models/llama_imported");
  CHECK(flag_value(arguments, "--load") == "/results/gpt3_126m/results/checkpoints");

  for (const char* bad : {"/models/megatron_llama.nemo", "''"}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH_AS(
        megatron_training_arguments(
            composed_126m({std::string("++training.model.restore_from_path=") + bad})),
        doctest::Contains("training.model.restore_from_path"), common::Error);
  }
  CHECK_THROWS_WITH_AS(megatron_training_arguments(composed_126m(
                           {"++training.model.restore_from_path=/m/model.nemo"})),
                       doctest::Contains("checkpoint_util --import-nemo <file.nemo> --save <dir>"), common::Error);
}

TEST_CASE("NeMo's preemption callback (on unless set false) becomes --exit-signal-handler") {
  // NeMo's exp_manager creates it by default with the checkpoint callback; the 23.07 and 23.08
  // trees leave the key unset.
  const auto by_default = megatron_training_arguments(composed_126m({}));
  CHECK(has(by_default, "--save"));
  CHECK(has(by_default, "--exit-signal-handler"));
  CHECK(has(megatron_training_arguments(
                composed_126m({"++training.exp_manager.create_preemption_callback=true"})),
            "--exit-signal-handler"));
  CHECK_FALSE(has(megatron_training_arguments(
                      composed_126m({"++training.exp_manager.create_preemption_callback=false"})),
                  "--exit-signal-handler"));
  // NeMo makes none without checkpoints: there would be nothing to save.
  CHECK_FALSE(has(megatron_training_arguments(
                      composed_126m({"training.exp_manager.create_checkpoint_callback=false"})),
                  "--exit-signal-handler"));
  CHECK_THROWS_WITH_AS(
      megatron_training_arguments(
          composed_126m({"++training.exp_manager.create_preemption_callback=sometimes"})),
      doctest::Contains("training.exp_manager.create_preemption_callback"), common::Error);
}

TEST_CASE("exp_manager.rollback_on_spike and spike_detection become --rollback-on-spike and its flags") {
  const auto none = megatron_training_arguments(composed_126m({}));
  CHECK_FALSE(has(none, "--rollback-on-spike"));
  CHECK_FALSE(has(none, "--spike-threshold"));

  const auto arguments = megatron_training_arguments(composed_126m(
      {"++training.exp_manager.rollback_on_spike=true",
       "++training.exp_manager.spike_detection.threshold=3.5",
       "++training.exp_manager.spike_detection.window=10",
       "++training.exp_manager.spike_detection.nan_iterations=2",
       "++training.exp_manager.spike_detection.lr_factor=0.5",
       "++training.exp_manager.spike_detection.max_rollbacks=4"}));
  CHECK(has(arguments, "--rollback-on-spike"));
  CHECK(has(arguments, "--save"));  // the checkpoints a rollback reloads
  CHECK(flag_value(arguments, "--spike-threshold") == "3.5");
  CHECK(flag_value(arguments, "--spike-window") == "10");
  CHECK(flag_value(arguments, "--spike-nan-iterations") == "2");
  CHECK(flag_value(arguments, "--spike-lr-factor") == "0.5");
  CHECK(flag_value(arguments, "--spike-max-rollbacks") == "4");
  CHECK_FALSE(has(megatron_training_arguments(
                      composed_126m({"++training.exp_manager.rollback_on_spike=false"})),
                  "--rollback-on-spike"));

  // Without checkpoints there is nothing to roll back to: refused before anything is queued
  // (pretrain_gpt would refuse the job once it started).
  const Node without_checkpoints =
      composed_126m({"++training.exp_manager.rollback_on_spike=true",
                     "training.exp_manager.create_checkpoint_callback=false"});
  CHECK_THROWS_WITH_AS(megatron_training_arguments(without_checkpoints),
                       "training.exp_manager.rollback_on_spike: true needs "
                       "training.exp_manager.create_checkpoint_callback: true (a rollback reloads "
                       "the last checkpoint the run saved) (from the command line)",
                       common::Error);
  CHECK_THROWS_WITH_AS(
      megatron_training_arguments(composed_126m({"++training.exp_manager.rollback_on_spike=maybe"})),
      doctest::Contains("training.exp_manager.rollback_on_spike"), common::Error);

  // The values by the backend's rules for the flags, every bad one at once.
  const auto problems = training_value_problems(
      composed_126m({"++training.exp_manager.spike_detection.threshold=1",
                     "++training.exp_manager.spike_detection.lr_factor=0"}));
  REQUIRE(problems.size() == 2);
  CHECK(problems[0].find("training.exp_manager.spike_detection.threshold: '1' is out of range; "
                         "training.exp_manager.spike_detection.threshold (--spike-threshold) "
                         "takes") != std::string::npos);
  CHECK(problems[1].find("training.exp_manager.spike_detection.lr_factor: '0' is out of range; "
                         "training.exp_manager.spike_detection.lr_factor (--spike-lr-factor) "
                         "takes") != std::string::npos);
}

TEST_CASE("NeMo's rampup_batch_size becomes Megatron's sample-based ramp-up") {
  const auto arguments = megatron_training_arguments(composed_126m(
      {"training.model.rampup_batch_size=[8,8,400]", "training.model.global_batch_size=32",
       "training.trainer.max_steps=100", "training.model.optim.sched.warmup_steps=10"}));
  CHECK_FALSE(has(arguments, "--train-iters"));
  CHECK_FALSE(has(arguments, "--lr-warmup-iters"));
  CHECK_FALSE(has(arguments, "--lr-decay-iters"));
  CHECK(flag_value(arguments, "--train-samples") == "3200");
  CHECK(flag_value(arguments, "--lr-warmup-samples") == "320");
  CHECK(flag_value(arguments, "--lr-decay-samples") == "3200");
  const auto at = std::find(arguments.begin(), arguments.end(), "--rampup-batch-size");
  REQUIRE(std::distance(at, arguments.end()) >= 4);
  CHECK(std::vector<std::string>(at + 1, at + 4) == std::vector<std::string>{"8", "8", "400"});

  CHECK_THROWS_WITH_AS(megatron_training_arguments(
                           composed_126m({"training.model.rampup_batch_size=[8,8]"})),
                       doctest::Contains("training.model.rampup_batch_size: expected [start_batch_size"),
                       common::Error);
  CHECK_THROWS_WITH_AS(megatron_training_arguments(
                           composed_126m({"training.model.rampup_batch_size=[8,0,400]"})),
                       doctest::Contains("training.model.rampup_batch_size.1 is 0"), common::Error);
}

TEST_CASE("NeMo's layernorm1p and rotary_percentage reach pretrain_gpt's flags") {
  // NeMo's *_improved GPT configs: normalization layernorm1p, rotary_percentage 0.5. The first
  // was refused and the second dropped without a word.
  const auto improved = megatron_training_arguments(composed_126m(
      {"++training.model.normalization=layernorm1p", "++training.model.rotary_percentage=0.5",
       "++training.model.position_embedding_type=rope"}));
  CHECK(has(improved, "--apply-layernorm-1p"));
  CHECK_FALSE(has(improved, "--normalization"));
  CHECK(flag_value(improved, "--rotary-percent") == "0.5");
  CHECK_FALSE(has(megatron_training_arguments(
                      composed_126m({"++training.model.normalization=layernorm"})),
                  "--apply-layernorm-1p"));
  CHECK_THROWS_WITH_AS(
      megatron_training_arguments(composed_126m({"++training.model.normalization=batchnorm"})),
      doctest::Contains("valid: layernorm, layernorm1p, rmsnorm"), common::Error);
  CHECK_THROWS_WITH_AS(
      megatron_training_arguments(composed_126m({"++training.model.rotary_percentage=1.5"})),
      doctest::Contains("training.model.rotary_percentage: '1.5' is out of range"), common::Error);
}

TEST_CASE("NeMo's recompute keys: method and num_layers count only under full granularity") {
  struct Case {
    std::string granularity, method, layers;
    std::vector<std::string> expected;  // the recompute flags and values, in order
  };
  const std::vector<Case> cases = {
      // NeMo 23.07's gpt3/126m and 5b: selective with block and 0, which NeMo ignores.
      {"selective", "block", "0", {"--recompute-granularity", "selective"}},
      // NeMo 23.08's llama2_7b: no recompute at all.
      {"null", "block", "0", {}},
      {"full", "uniform", "2",
       {"--recompute-granularity", "full", "--recompute-method", "uniform",
        "--recompute-num-layers", "2"}},
      {"full", "null", "null", {"--recompute-granularity", "full"}},
  };
  for (const auto& c : cases) {
    CAPTURE(c.granularity);
    const auto arguments = megatron_training_arguments(
        composed_126m({"++training.model.activations_checkpoint_granularity=" + c.granularity,
                       "++training.model.activations_checkpoint_method=" + c.method,
                       "++training.model.activations_checkpoint_num_layers=" + c.layers}));
    std::vector<std::string> recompute;
    for (size_t i = 0; i + 1 < arguments.size(); ++i) {
      if (arguments[i].starts_with("--recompute-")) {
        recompute.insert(recompute.end(), {arguments[i], arguments[i + 1]});
      }
    }
    CHECK(recompute == c.expected);
  }
  // Under full a bad method is still refused by the backend's rule, naming the key.
  CHECK_THROWS_WITH_AS(
      megatron_training_arguments(composed_126m(
          {"++training.model.activations_checkpoint_granularity=full",
           "++training.model.activations_checkpoint_method=sideways"})),
      doctest::Contains("training.model.activations_checkpoint_method: 'sideways'"),
      common::Error);
}

TEST_CASE("every mapped value is checked with the backend's rule, naming the key and the flag") {
  struct Case {
    std::string override_;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"training.model.optim.lr=abc",
       "training.model.optim.lr: 'abc' is not a number; training.model.optim.lr (--lr) takes a "
       "real number ≥ 0"},
      {"training.model.global_batch_size=-4",
       "training.model.global_batch_size: '-4' is out of range; training.model.global_batch_size "
       "(--global-batch-size) takes an integer ≥ 1"},
      {"training.trainer.max_steps=-5",
       "training.trainer.max_steps: '-5' is out of range; training.trainer.max_steps "
       "(--train-iters) takes an integer ≥ 1"},
      {"training.model.hidden_dropout=2",
       "training.model.hidden_dropout: '2' is out of range; training.model.hidden_dropout "
       "(--hidden-dropout) takes a real number in [0, 1)"},
      {"training.model.make_vocab_size_divisible_by=0",
       "training.model.make_vocab_size_divisible_by: '0' is out of range"},
      {"training.model.num_layers=true", "training.model.num_layers: 'true' is not an integer"},
      {"training.model.optim.betas=[0.9,1.5]", "training.model.optim.betas.1: '1.5' is out of range"},
      {"training.model.seed=-1",
       "training.model.seed: '-1' is out of range; training.model.seed (--seed) takes"},
      {"training.model.activations_checkpoint_granularity=partial",
       "training.model.activations_checkpoint_granularity: 'partial' is not a valid choice; "
       "training.model.activations_checkpoint_granularity (--recompute-granularity) takes one of "
       "selective, full"},
      {"+training.model.num_query_groups=0",
       "training.model.num_query_groups: '0' is out of range; training.model.num_query_groups "
       "(--num-query-groups) takes"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.override_);
    CHECK_THROWS_WITH_AS(megatron_training_arguments(composed_126m({c.override_})),
                         doctest::Contains(c.message.c_str()), common::Error);
  }
  // With real data the split string is checked too.
  CHECK_THROWS_WITH_AS(
      megatron_training_arguments(composed_126m(
          {"training.model.data.data_impl=mmap", "training.model.data.data_prefix=[1.0,/data/x]",
           "training.model.data.splits_string='-1,2,3'"})),
      doctest::Contains("training.model.data.splits_string: '-1,2,3': '-1' is negative; "
                        "training.model.data.splits_string (--split) takes"),
      common::Error);
  // All problems at once.
  try {
    megatron_training_arguments(
        composed_126m({"training.model.optim.lr=abc", "training.model.hidden_dropout=2"}));
    FAIL("expected a refusal");
  } catch (const common::Error& error) {
    CHECK(std::string(error.what()).find("training.model.optim.lr") != std::string::npos);
    CHECK(std::string(error.what()).find("training.model.hidden_dropout") != std::string::npos);
  }
}

TEST_CASE("what the backend refuses only because it is not built yet is still translated") {
  const auto arguments = megatron_training_arguments(composed_126m(
      {"training.model.tensor_model_parallel_size=2", "training.model.tokenizer.type=Llama2Tokenizer",
       "training.model.tokenizer.model=/t.model"}));
  CHECK(flag_value(arguments, "--tensor-model-parallel-size") == "2");
  CHECK(flag_value(arguments, "--tokenizer-type") == "Llama2Tokenizer");
  CHECK(flag_value(arguments, "--tokenizer-model") == "/t.model");
}

TEST_CASE("every flag of the one-to-one table has a value rule in the backend's table") {
  for (const auto& row : training_flag_table()) {
    if (row.flag.find(' ') != std::string::npos || !row.note.empty()) continue;  // derived rows
    CAPTURE(row.flag);
    CHECK(common::find_flag_rule(row.flag) != nullptr);
  }
}
