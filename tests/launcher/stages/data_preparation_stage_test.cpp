// The data_preparation stage on the real conf/ tree: the seed workflow (one shard) and several
// shards become download / decompress / preprocess jobs with the right commands, arrays and
// dependencies; the blend list reaches training's --data-path; bad values are refused naming
// the key.
#include "launcher/stages/data_preparation_stage.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <vector>

#include "backend/common/error.hpp"
#include "launcher/config/compose.hpp"
#include "launcher/config/interpolate.hpp"
#include "launcher/stages/training_stage.hpp"

using namespace launcher;

namespace {

const std::string kSha = std::string(64, 'a');

ComposedConfig composed_with(std::vector<std::string> overrides, const std::string& option) {
  overrides.insert(overrides.begin(), "data_preparation=" + option);
  overrides.push_back("launcher_scripts_path=/opt/launcher");
  return compose({std::string(TEST_SOURCE_DIR) + "/conf", "config", overrides});
}

Node resolved_with(std::vector<std::string> overrides,
                   const std::string& option = "gpt3/download_and_preprocess") {
  ComposedConfig composed = composed_with(std::move(overrides), option);
  fill_data_preparation_blend(composed);
  return resolve(composed.config, ResolveContext{composed.choices});
}

std::vector<JobSpec> jobs_of(const Node& config) {
  return build_stage_jobs("data_preparation", {config, "/opt/bin", "nemo-"});
}

std::vector<std::string> words(std::initializer_list<const char*> list) {
  return std::vector<std::string>(list.begin(), list.end());
}

std::string flag_value(const std::vector<std::string>& arguments, const std::string& flag) {
  for (size_t i = 0; i + 1 < arguments.size(); ++i) {
    if (arguments[i] == flag) return arguments[i + 1];
  }
  return "<absent>";
}

}  // namespace

TEST_CASE("the seed workflow: OSCAR + GPT-2 vocab and merges → meg-gpt2_text_document, three jobs") {
  const Node config = resolved_with({});
  const std::vector<JobSpec> jobs = jobs_of(config);
  REQUIRE(jobs.size() == 3);

  const JobSpec& download = jobs[0];
  CHECK(download.step == "download");
  CHECK(download.job_name == "nemo-prepare_gpt3_download");
  CHECK(download.tool == "download");
  REQUIRE(download.array_tasks.size() == 3);  // the shard, vocab, merges
  CHECK(download.array_tasks[0] ==
        words({"/opt/bin/download",
               "https://huggingface.co/bigscience/misc-test-data/resolve/main/stas/oscar-1GB.jsonl.xz",
               "--output", "/opt/launcher/data/downloads/oscar-1GB.jsonl.xz", "--retries", "5"}));
  CHECK(download.array_tasks[1] ==
        words({"/opt/bin/download", "https://s3.amazonaws.com/models.huggingface.co/bert/gpt2-vocab.json",
               "--output", "/opt/launcher/data/bpe/vocab.json", "--retries", "5"}));
  CHECK(download.array_tasks[2][1] == "https://s3.amazonaws.com/models.huggingface.co/bert/gpt2-merges.txt");
  CHECK(download.array_tasks[2][3] == "/opt/launcher/data/bpe/merges.txt");

  const JobSpec& decompress = jobs[1];  // one shard: a plain job, not an array
  CHECK_FALSE(decompress.is_array());
  CHECK(decompress.command == words({"/opt/bin/decompress", "/opt/launcher/data/downloads/oscar-1GB.jsonl.xz",
                                     "--output", "/opt/launcher/data/downloads/oscar-1GB.jsonl"}));

  const JobSpec& preprocess = jobs[2];
  CHECK_FALSE(preprocess.is_array());
  CHECK(preprocess.command ==
        words({"/opt/bin/preprocess_data", "--input", "/opt/launcher/data/downloads/oscar-1GB.jsonl",
               "--output-prefix", "/opt/launcher/data/meg-gpt2", "--json-keys", "text", "--tokenizer-type",
               "GPT2BPETokenizer", "--vocab-file", "/opt/launcher/data/bpe/vocab.json", "--merge-file",
               "/opt/launcher/data/bpe/merges.txt", "--append-eod", "--workers", "2", "--log-interval", "1000"}));
  CHECK(preprocess.cpus_per_task == 2);
  for (const JobSpec& job : jobs) {
    CAPTURE(job.job_name);
    CHECK(job.stage == "data_preparation");
    CHECK_FALSE(job.uses_gpus);
    CHECK(job.successors_need_success);  // each step, and training after the last, waits afterok
    CHECK(job.run_dependency == "singleton");
    CHECK(job.results_dir == "/opt/launcher/results/prepare_gpt3");
  }

  // The blend list the launcher fills in, and training reading it.
  const Node& blend = at_path(config, "data_preparation.data_prefix");
  REQUIRE(blend.is_list());
  REQUIRE(blend.size() == 2);
  CHECK(blend.at(0).as_double() == 1.0);
  CHECK(blend.at(1).as_string() == "/opt/launcher/data/meg-gpt2_text_document");
  const Node training_config = resolved_with(
      {"training=gpt3/126m", "training.model.data.data_impl=mmap",
       "training.model.data.data_prefix=${data_preparation.data_prefix}"});
  const auto arguments = megatron_training_arguments(training_config);
  const auto at = std::find(arguments.begin(), arguments.end(), "--data-path");
  REQUIRE(at != arguments.end());
  REQUIRE(arguments.end() - at >= 3);
  CHECK(*(at + 1) == "1");
  CHECK(*(at + 2) == "/opt/launcher/data/meg-gpt2_text_document");
  CHECK(flag_value(arguments, "--vocab-file") == "/opt/launcher/data/bpe/vocab.json");  // where it is downloaded
}

TEST_CASE("a SentencePiece tokenizer's model file reaches preprocess_data as --tokenizer-model") {
  const Node config = resolved_with({"data_preparation.input=[/data/corpus.jsonl]",
                                     "data_preparation.tokenizer.type=Llama2Tokenizer",
                                     "data_preparation.tokenizer.vocab_file=null",
                                     "data_preparation.tokenizer.merge_file=null",
                                     "+data_preparation.tokenizer.model=/models/tokenizer.model"},
                                    "gpt3/preprocess");
  const std::vector<JobSpec> jobs = jobs_of(config);
  REQUIRE_FALSE(jobs.empty());
  const JobSpec& preprocess = jobs.back();
  CHECK(flag_value(preprocess.command, "--tokenizer-type") == "Llama2Tokenizer");
  CHECK(flag_value(preprocess.command, "--tokenizer-model") == "/models/tokenizer.model");
  CHECK(flag_value(preprocess.command, "--vocab-file") == "<absent>");
}

TEST_CASE("several shards: job arrays, numbered outputs, checksums, and only compressed shards decompressed") {
  const Node config = resolved_with(
      {"data_preparation.file_urls=[https://host/a.jsonl.zst,'/data/my corpus/b.jsonl',file:///c.jsonl.gz]",
       fmt::format("data_preparation.file_sha256=[{},null,{}]", kSha, std::string(64, 'B')),
       fmt::format("data_preparation.vocab_sha256={}", kSha), "data_preparation.max_parallel_tasks=2",
       "data_preparation.workers=4", "data_dir=/d"});
  const std::vector<JobSpec> jobs = jobs_of(config);
  REQUIRE(jobs.size() == 3);
  const auto& downloads = jobs[0].array_tasks;
  REQUIRE(downloads.size() == 5);
  CHECK(downloads[0] == words({"/opt/bin/download", "https://host/a.jsonl.zst", "--output", "/d/downloads/a.jsonl.zst",
                               "--sha256", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
                               "--retries", "5"}));
  // An absolute path becomes a file:// URL, percent-encoded; no checksum given for it.
  CHECK(downloads[1] == words({"/opt/bin/download", "file:///data/my%20corpus/b.jsonl", "--output",
                               "/d/downloads/b.jsonl", "--retries", "5"}));
  CHECK(flag_value(downloads[2], "--sha256") == std::string(64, 'b'));  // lowercased
  CHECK(flag_value(downloads[3], "--sha256") == kSha);                  // vocab_sha256
  CHECK(jobs[0].max_parallel_tasks == 2);

  const auto& decompressions = jobs[1].array_tasks;
  REQUIRE(decompressions.size() == 2);
  CHECK(decompressions[0] == words({"/opt/bin/decompress", "/d/downloads/a.jsonl.zst", "--output", "/d/downloads/a.jsonl"}));
  CHECK(decompressions[1] == words({"/opt/bin/decompress", "/d/downloads/c.jsonl.gz", "--output", "/d/downloads/c.jsonl"}));

  const auto& preprocessing = jobs[2].array_tasks;
  REQUIRE(preprocessing.size() == 3);
  CHECK(jobs[2].cpus_per_task == 4);
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"/d/downloads/a.jsonl", "/d/meg-gpt2_00"}, {"/d/downloads/b.jsonl", "/d/meg-gpt2_01"},
      {"/d/downloads/c.jsonl", "/d/meg-gpt2_02"}};
  for (size_t i = 0; i < 3; ++i) {
    CAPTURE(i);
    CHECK(flag_value(preprocessing[i], "--input") == expected[i].first);
    CHECK(flag_value(preprocessing[i], "--output-prefix") == expected[i].second);
  }
  const Node& blend = at_path(config, "data_preparation.data_prefix");
  REQUIRE(blend.size() == 6);
  CHECK(blend.at(1).as_string() == "/d/meg-gpt2_00_text_document");
  CHECK(blend.at(5).as_string() == "/d/meg-gpt2_02_text_document");
}

TEST_CASE("decompress: false leaves the decompress job out — preprocess_data reads the compressed shards") {
  const Node config = resolved_with({"data_preparation.file_urls=[https://h/a.jsonl.xz,https://h/b.jsonl.xz]",
                                     "data_preparation.decompress=false", "data_preparation.vocab_url=null",
                                     "data_preparation.merges_url=null", "data_dir=/d"});
  const std::vector<JobSpec> jobs = jobs_of(config);
  REQUIRE(jobs.size() == 2);
  CHECK(jobs[0].array_tasks.size() == 2);  // no tokenizer downloads
  CHECK(jobs[1].step == "preprocess");
  CHECK(flag_value(jobs[1].array_tasks[1], "--input") == "/d/downloads/b.jsonl.xz");
}

TEST_CASE("eleven or more shards get as many digits as the last index needs") {
  std::string urls = "data_preparation.file_urls=[";
  for (int i = 0; i < 101; ++i) urls += fmt::format("{}https://h/s{}.jsonl", i ? "," : "", i);
  const Node config = resolved_with({urls + "]", "data_dir=/d"});
  const std::vector<JobSpec> jobs = jobs_of(config);
  REQUIRE(jobs.size() == 2);  // nothing compressed: no decompress job
  CHECK(flag_value(jobs[1].array_tasks[0], "--output-prefix") == "/d/meg-gpt2_000");
  CHECK(flag_value(jobs[1].array_tasks[100], "--output-prefix") == "/d/meg-gpt2_100");
}

TEST_CASE("no file_urls: nothing to submit") {
  CHECK(jobs_of(resolved_with({"data_preparation.file_urls=[]"})).empty());
}

TEST_CASE("the preprocess shape is one CPU job, and its blend is its one output") {
  const Node config = resolved_with({"data_preparation.input=[/c/a.jsonl,/c/b.jsonl.gz]", "data_dir=/d"},
                                    "gpt3/preprocess");
  const std::vector<JobSpec> jobs = jobs_of(config);
  REQUIRE(jobs.size() == 1);
  CHECK(jobs[0].step.empty());
  CHECK(jobs[0].job_name == "nemo-preprocess_gpt3");
  CHECK_FALSE(jobs[0].uses_gpus);
  CHECK(jobs[0].command == words({"/opt/bin/preprocess_data", "--input", "/c/a.jsonl", "/c/b.jsonl.gz",
                                  "--output-prefix", "/d/my-gpt3", "--json-keys", "text", "--tokenizer-type",
                                  "GPT2BPETokenizer", "--vocab-file", "/d/bpe/vocab.json", "--merge-file",
                                  "/d/bpe/merges.txt", "--append-eod", "--workers", "2", "--log-interval", "1000"}));
  const Node& blend = at_path(config, "data_preparation.data_prefix");
  REQUIRE(blend.size() == 2);
  CHECK(blend.at(1).as_string() == "/d/my-gpt3_text_document");
  CHECK(jobs_of(resolved_with({}, "gpt3/preprocess")).empty());  // no input: nothing to submit
}

TEST_CASE("a data_prefix the user set is kept") {
  const Node config = resolved_with({"data_preparation.data_prefix=[0.5,/x,0.5,/y]"});
  CHECK(at_path(config, "data_preparation.data_prefix").size() == 4);
  CHECK(at_path(config, "data_preparation.data_prefix").at(1).as_string() == "/x");
}

TEST_CASE("bad data_preparation values are refused, naming the key and what would be valid") {
  auto refused = [](std::vector<std::string> overrides, const std::string& message) {
    CAPTURE(message);
    CHECK_THROWS_WITH_AS(jobs_of(resolved_with(std::move(overrides))), doctest::Contains(message.c_str()),
                         common::Error);
  };
  refused({"data_preparation.file_urls=[https://h/a.jsonl,https://h/b.jsonl]", fmt::format("data_preparation.file_sha256=[{}]", kSha)},
          "data_preparation.file_sha256 has 1 entries but data_preparation.file_urls has 2");
  refused({"data_preparation.file_sha256=[abc]"},
          "data_preparation.file_sha256.0: 'abc' is not a SHA-256 digest (64 hexadecimal digits");
  refused({"data_preparation.vocab_sha256=xyz"}, "data_preparation.vocab_sha256: 'xyz' is not a SHA-256 digest");
  refused({"data_preparation.file_urls=[data/a.jsonl]"},
          "data_preparation.file_urls.0: 'data/a.jsonl' is neither a URL (https://..., file:///...) nor an absolute path");
  refused({"data_preparation.file_urls=[https://h/dir/]"}, "data_preparation.file_urls.0: 'https://h/dir/' names no file");
  refused({"data_preparation.file_urls=[https://h/x/a.jsonl,https://g/y/a.jsonl]"},
          "data_preparation.file_urls.0 and data_preparation.file_urls.1 would both download to");
  refused({"data_preparation.workers=0"}, "data_preparation.workers must be a positive integer, got 0");
  refused({"data_preparation.max_parallel_tasks=0"}, "data_preparation.max_parallel_tasks must be a positive integer");
  refused({"data_preparation.retries=-1"}, "data_preparation.retries must be at least 0, got -1");
  refused({"data_preparation.tokenizer.vocab_file=null"},
          "data_preparation.tokenizer.vocab_file is not set: data_preparation.vocab_url is downloaded there");
  refused({"data_preparation.download_dir=null"}, "data_preparation.download_dir is not set");
  refused({"data_preparation.decompress=maybe"}, "data_preparation.decompress");
}
