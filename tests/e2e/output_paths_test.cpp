// Output paths through the real executables (issue 37, item 1): every flag that names a file a
// tool writes whole follows one rule (common::output_target, docs/security.md "Output files").
// As root, `launcher report --html /dev/full` used to print "wrote /dev/full", exit 0 and leave
// /dev/full a regular file; evaluate_gpt --results-json, pretrain_gpt --benchmark-output and
// download -o did the same, and a symbolic link was replaced by a file. Now a FIFO, a device, a
// directory, a dangling or looping link are refused (exit 2, naming the flag, the path and what
// it is, and left as they were), a link to a regular file has that file replaced while the link
// stays, and a name of the tool's own standard output is written through.
#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "bounded_run.hpp"
#include "hostile_outputs.hpp"
#include "launcher/process.hpp"
#include "temporary_directory.hpp"
#include "test_files.hpp"
#include "tiny_lambada_checkpoint.hpp"

namespace fs = std::filesystem;

namespace {

using test_support::check_refused;
using test_support::join;
using test_support::kTestBin;
using test_support::read_file;
using test_support::run_bounded;

// Refused for each hostile path: exit 2, "cannot write <flag> <path>: <what it is>", unchanged.
template <typename Command>
void check_hostile_outputs_refused(const fs::path& directory, const std::string& flag,
                                   const Command& command_for) {
  for (const auto& hostile : test_support::make_hostile_outputs(directory)) {
    CAPTURE(hostile.path);
    check_refused(run_bounded(command_for(hostile.path)),
                  "cannot write " + flag + " " + hostile.path + ": " + hostile.refusal);
    test_support::check_unchanged(hostile);
  }
}

// A link in `directory` to a regular file elsewhere, and the file's path.
std::pair<fs::path, fs::path> link_to_regular_file(const fs::path& directory) {
  fs::create_directories(directory / "elsewhere");
  const fs::path target = directory / "elsewhere" / "target";
  std::ofstream(target) << "old";
  const fs::path link = directory / "link";
  fs::create_symlink(target, link);
  return {link, target};
}

// A link in `directory` to the tool's own standard output, whatever it is (here a pipe).
fs::path link_to_standard_output(const fs::path& directory) {
  const fs::path link = directory / "stdout-link";
  fs::create_symlink("/proc/self/fd/1", link);
  return link;
}

// A run directory with one job log of two iteration lines: enough for a report page.
fs::path logged_run(const fs::path& base) {
  const fs::path run = base / "logged";
  fs::create_directories(run);
  std::ofstream log(run / "log-logged_1.out");
  for (int i = 1; i <= 2; ++i) {
    log << " [2026-11-27 13:00:0" << i << "] iteration        " << i << "/       2 | consumed "
        << "samples:            4 | elapsed time per iteration (ms): 500.0 | learning rate: "
        << "1.000000E-03 | global batch size:     4 | lm loss: 9.000000E+00 | loss scale: 1.0 | "
        << "grad norm: 2.000 | number of skipped iterations:   0 | number of nan iterations:   0 |\n";
  }
  return run;
}

}  // namespace

TEST_CASE("launcher report --html: devices, FIFOs and broken links are refused and links are followed") {
  test_support::TemporaryDirectory temporary;
  const fs::path run = logged_run(temporary.path);
  auto report = [&](const std::string& output) {
    return std::vector<std::string>{kTestBin + "/launcher", "report", run.string(), "--html", output};
  };
  check_hostile_outputs_refused(temporary.path, "--html", report);

  const auto [link, target] = link_to_regular_file(temporary.path);
  const auto linked = run_bounded(report(link.string()));
  INFO(linked.output);
  CHECK(linked.exit_code == 0);
  CHECK(fs::is_symlink(link));
  CHECK(read_file(target).starts_with("<!DOCTYPE html>"));

  const auto printed = run_bounded(report(link_to_standard_output(temporary.path).string()));
  CHECK(printed.exit_code == 0);
  CHECK(printed.output.find("<!DOCTYPE html>") != std::string::npos);
  CHECK(fs::is_symlink(temporary.path / "stdout-link"));
}

TEST_CASE("evaluate_gpt --results-json: refused before the evaluation and links are followed") {
  test_support::TinyLambadaCheckpoint model("output_paths_test");
  test_support::train_tiny_lambada_checkpoint(model, 1);
  INFO(model.output);
  REQUIRE(model.ok);
  auto evaluate = [&](const std::string& output) {
    return join(join({kTestBin + "/evaluate_gpt"}, test_support::tiny_lambada_model_flags()),
                {"--load", model.checkpoints.string(), "--micro-batch-size", "2", "--task",
                 "WIKITEXT103", "--valid-data", test_support::kTestData + "/zero_shot/wiki.test.tokens",
                 "--results-json", output});
  };
  check_hostile_outputs_refused(model.temporary.path, "--results-json", evaluate);

  const auto [link, target] = link_to_regular_file(model.temporary.path);
  const auto linked = run_bounded(evaluate(link.string()));
  INFO(linked.output);
  CHECK(linked.exit_code == 0);
  CHECK(fs::is_symlink(link));
  CHECK(read_file(target).find("\"task\": \"WIKITEXT103\"") != std::string::npos);

  // Written through after the result lines, in order.
  const auto printed = run_bounded(evaluate(link_to_standard_output(model.temporary.path).string()));
  INFO(printed.output);
  CHECK(printed.exit_code == 0);
  const size_t results = printed.output.find("validation results on WIKITEXT103");
  const size_t json = printed.output.find("\"task\": \"WIKITEXT103\"");
  CHECK(results != std::string::npos);
  CHECK(json != std::string::npos);
  CHECK(results < json);
}

TEST_CASE("pretrain_gpt --benchmark-output: refused before training and links are followed") {
  test_support::TemporaryDirectory temporary;
  auto pretrain = [&](const std::string& output) {
    return std::vector<std::string>{
        kTestBin + "/pretrain_gpt", "--num-layers", "1", "--hidden-size", "32",
        "--num-attention-heads", "4", "--seq-length", "16", "--max-position-embeddings", "16",
        "--micro-batch-size", "2", "--lr", "1e-3", "--train-iters", "3", "--eval-iters", "0",
        "--mock-data", "--vocab-size", "64", "--device", "cpu", "--benchmark-output", output};
  };
  check_hostile_outputs_refused(temporary.path, "--benchmark-output", pretrain);

  const auto [link, target] = link_to_regular_file(temporary.path);
  const auto linked = run_bounded(pretrain(link.string()));
  INFO(linked.output);
  CHECK(linked.exit_code == 0);
  CHECK(fs::is_symlink(link));
  CHECK(read_file(target).find("\"tokens_per_second\"") != std::string::npos);
}

TEST_CASE("download -o: refused before anything is fetched and --force replaces a link's target") {
  test_support::TemporaryDirectory temporary;
  const fs::path source = temporary.path / "source.jsonl";
  std::ofstream(source) << "{\"text\": \"x\"}\n";
  auto download = [&](const std::string& output) {
    return std::vector<std::string>{kTestBin + "/download", "file://" + source.string(), "--force",
                                    "-o", output};
  };
  check_hostile_outputs_refused(temporary.path, "--output", download);

  // It used to replace the link by the file, leaving the link's target as it was.
  const auto [link, target] = link_to_regular_file(temporary.path);
  const auto linked = run_bounded(download(link.string()));
  INFO(linked.output);
  CHECK(linked.exit_code == 0);
  CHECK(fs::is_symlink(link));
  CHECK(read_file(target) == "{\"text\": \"x\"}\n");

  // A .part cannot be renamed onto a pipe: the tool's standard output is refused, saying so.
  const fs::path stdout_link = link_to_standard_output(temporary.path);
  check_refused(run_bounded(download(stdout_link.string())),
                "cannot write --output " + stdout_link.string() + ": it is this process's "
                "standard output");
  CHECK(fs::is_symlink(stdout_link));
}
