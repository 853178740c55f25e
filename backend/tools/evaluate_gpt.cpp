// evaluate_gpt: Megatron-LM's zero-shot GPT evaluation (tasks/main.py --task WIKITEXT103 or
// LAMBADA, tasks/zeroshot_gpt/evaluate.py), native. Reads pretrain_gpt's model, tokenizer,
// device and --load flags (the same parser, backend/train/arguments.hpp) and the task flags
// (--task, --valid-data, --overlapping-eval, --strict-lambada, and our --results-json), loads
// the checkpoint's weights, scores each --valid-data file in evaluation mode (no dropout) and
// prints Megatron's result lines; the metrics are backend/eval/zero_shot_tasks.hpp's, and
// docs/evaluation.md describes the tool. One process; a user error is one clear line and exit
// status 2, as pretrain_gpt's.
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <iostream>
#include <string>
#include <vector>

#include "backend/common/durable_file.hpp"
#include "backend/common/logging.hpp"
#include "backend/common/tool_main.hpp"
#include "backend/data/tokenizer.hpp"
#include "backend/model/gpt_model.hpp"
#include "backend/train/arguments.hpp"
#include "backend/train/trained_model.hpp"
#include "backend/train/trainer.hpp"
#include "backend/eval/zero_shot_tasks.hpp"

namespace {

using backend::TrainingArguments;

// What this tool does not do (yet): several processes, or a model split over them
// (trained_model.hpp); and the task flags' combinations.
void check_single_process(const TrainingArguments& arguments) {
  backend::check_whole_model_launch(arguments, "evaluate_gpt");
  if (arguments.tasks.task == backend::ZeroShotTask::lambada &&
      arguments.tasks.overlapping_eval != 32) {
    spdlog::warn("--overlapping-eval {} applies to WIKITEXT103 only; LAMBADA ignores it",
                 arguments.tasks.overlapping_eval);
  }
  if (arguments.tasks.task == backend::ZeroShotTask::wikitext103) {
    backend::check_overlapping_eval(arguments.tasks.overlapping_eval, arguments.model.seq_length);
    if (arguments.tasks.strict_lambada) spdlog::warn("--strict-lambada applies to LAMBADA only");
  }
}

backend::WindowScorer make_scorer(backend::GptModel<float>& model, int64_t seq_length) {
  backend::WindowScorer scorer;
  scorer.losses = [&model, seq_length](std::span<const int32_t> inputs,
                                       std::span<const int32_t> labels, int64_t batch) {
    model.forward(inputs, labels, batch, seq_length);
    const std::vector<float> losses = model.last_position_losses();
    return std::vector<double>(losses.begin(), losses.end());
  };
  scorer.argmax = [&model, seq_length](std::span<const int32_t> inputs,
                                       std::span<const int32_t> labels, int64_t batch) {
    model.forward(inputs, labels, batch, seq_length);
    return model.last_position_argmax();
  };
  return scorer;
}

int run(const TrainingArguments& arguments) {
  check_single_process(arguments);
  // Written at the end; a path that can never take it is refused before the evaluation runs.
  if (!arguments.tasks.results_json.empty()) {
    common::output_target(arguments.tasks.results_json, "--results-json");
  }
  auto tokenizer = backend::build_tokenizer(arguments.tokenizer);
  const backend::SelectedDevice selected = backend::select_device(arguments);
  backend::GptModel<float> model = backend::load_trained_model(arguments, selected, "evaluate_gpt");
  const backend::WindowScorer scorer = make_scorer(model, arguments.model.seq_length);
  const int32_t pad = tokenizer->eod();
  auto progress = [&](int64_t iteration) {
    if (iteration % arguments.logging.log_interval == 0) {
      std::cout << fmt::format("> working on iteration: {}", iteration) << std::endl;
    }
  };

  nlohmann::json results = nlohmann::json::array();
  for (const std::string& file : arguments.tasks.valid_data) {
    nlohmann::json result = {{"valid_data", file}};
    std::vector<std::string> lines;
    if (arguments.tasks.task == backend::ZeroShotTask::wikitext103) {
      const backend::WikitextText text = backend::read_wikitext(file, *tokenizer);
      std::cout << fmt::format(" > number of original tokens: {}, number of detokenized tokens: "
                               "{}", text.num_original_tokens, text.num_tokenized_tokens)
                << std::endl;
      const double total_loss = backend::wikitext_total_loss(
          text.tokens, arguments.model.seq_length, arguments.tasks.overlapping_eval, pad,
          arguments.run.micro_batch_size, scorer, progress);
      const backend::PerplexityResult r = backend::perplexity_result(
          total_loss, text.num_tokenized_tokens, text.num_original_tokens);
      lines = backend::format_results(std::string(common::enum_name(arguments.tasks.task)), r);
      result.update({{"avg_loss", r.avg_loss},
                     {"ppl", r.ppl},
                     {"adjusted_ppl", r.adjusted_ppl},
                     {"token_ratio", r.token_ratio},
                     {"total_loss", r.total_loss},
                     {"num_original_tokens", r.num_original_tokens},
                     {"num_tokenized_tokens", r.num_tokenized_tokens},
                     {"windows", backend::wikitext_window_count(
                                     text.num_tokenized_tokens, arguments.model.seq_length,
                                     arguments.tasks.overlapping_eval)}});
    } else {
      std::cout << fmt::format("> building lambada dataset from {} ...", file) << std::endl;
      const std::vector<backend::LambadaExample> examples = backend::read_lambada(
          file, *tokenizer, arguments.tasks.strict_lambada, arguments.model.seq_length);
      std::cout << fmt::format(" > found {} samples.", examples.size()) << std::endl;
      const int64_t correct =
          backend::lambada_correct(examples, arguments.model.seq_length, pad,
                                   arguments.run.micro_batch_size, scorer, progress);
      const backend::AccuracyResult r =
          backend::accuracy_result(correct, std::ssize(examples));
      lines = backend::format_results(std::string(common::enum_name(arguments.tasks.task)), r);
      result.update({{"number_correct", r.number_correct},
                     {"total_examples", r.total_examples},
                     {"avg_accuracy", r.avg_accuracy}});
    }
    for (const auto& line : lines) std::cout << line << '\n';
    std::cout.flush();
    results.push_back(std::move(result));
  }
  if (!arguments.tasks.results_json.empty()) {
    const nlohmann::json document = {
        {"task", common::enum_name(arguments.tasks.task)},
        {"load", arguments.checkpointing.load},
        {"seq_length", arguments.model.seq_length},
        {"overlapping_eval", arguments.tasks.task == backend::ZeroShotTask::wikitext103
                                 ? nlohmann::json(arguments.tasks.overlapping_eval)
                                 : nullptr},
        {"strict_lambada", arguments.tasks.task == backend::ZeroShotTask::lambada
                               ? nlohmann::json(arguments.tasks.strict_lambada)
                               : nullptr},
        {"results", results}};
    common::write_text_file_atomically(arguments.tasks.results_json, document.dump(2) + "\n",
                                       common::FileMode::regular, "--results-json");
  }
  std::cout << "done :-)" << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  common::setup_logging("evaluate_gpt");
  return common::run_tool([&] {
    auto arguments =
        backend::parse_arguments(argc, argv, backend::ArgumentsProgram::evaluate_gpt);
    if (!arguments) return 0;  // --help
    common::print_lines(backend::format_arguments(*arguments));  // in one write
    return run(*arguments);
  });
}
