// The data_preparation stage on the real conf/ tree: the seed workflow (one shard) and several
// shards become download / decompress / preprocess jobs with the right commands, arrays and
// dependencies; the blend list reaches training's --data-path; bad values are refused naming
// the key. NeMo 23.07's download_gpt3_pile, from its unchanged conf tree, renders NeMo's shard
// names and steps (jobs, and the Slurm and local scripts of a --dry-run launch).
#include "launcher/stages/data_preparation_stage.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "backend/common/error.hpp"
#include "launcher/config/compose.hpp"
#include "launcher/config/interpolate.hpp"
#include "launcher/launch.hpp"
#include "launcher/stages/command_flags.hpp"
#include "launcher/stages/training_stage.hpp"
#include "quiet_logger.hpp"
#include "temporary_directory.hpp"
#include "test_files.hpp"

using namespace launcher;
using test_support::QuietLogger;
using test_support::read_file;
using test_support::TemporaryDirectory;

namespace {

using test_support::flag_value;

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

// ---- NeMo's Pile option, from NeMo 23.07's own conf tree, unchanged ----

namespace {

Node nemo_pile_config(std::vector<std::string> overrides) {
  overrides.insert(overrides.begin(), {"stages=[data_preparation]", "launcher_scripts_path=/opt/launcher"});
  ComposedConfig composed =
      compose({std::string(TEST_SOURCE_DIR) + "/tests/data/nemo_23.07/conf", "config", overrides});
  fill_data_preparation_blend(composed);
  return resolve(composed.config, ResolveContext{composed.choices});
}

}  // namespace

TEST_CASE("NeMo 23.07's download_gpt3_pile: 30 shards downloaded, extracted and tokenized as NeMo names them") {
  for (const char* cluster_type : {"bcm", "local"}) {
    CAPTURE(cluster_type);
    const Node config = nemo_pile_config({std::string("cluster_type=") + cluster_type});
    const std::vector<JobSpec> jobs = jobs_of(config);
    REQUIRE(jobs.size() == 3);
    CHECK(jobs[0].step == "download");
    CHECK(jobs[1].step == "extract");
    CHECK(jobs[2].step == "preprocess");
    CHECK(jobs[0].job_name == "nemo-download_gpt3_pile_download");

    // download: the 30 shards, then the vocab and the merges (NeMo fetches those at launch).
    const auto& downloads = jobs[0].array_tasks;
    REQUIRE(downloads.size() == 32);
    CHECK(downloads[0] == words({"/opt/bin/download", "https://mystic.the-eye.eu/public/AI/pile/train/00.jsonl.zst",
                                 "--output", "/opt/launcher/data/00.jsonl.zst", "--retries", "5"}));
    CHECK(downloads[29][1] == "https://mystic.the-eye.eu/public/AI/pile/train/29.jsonl.zst");
    CHECK(downloads[29][3] == "/opt/launcher/data/29.jsonl.zst");
    CHECK(downloads[30] == words({"/opt/bin/download", "https://huggingface.co/gpt2/resolve/main/vocab.json",
                                  "--output", "/opt/launcher/data/bpe/vocab.json", "--retries", "5"}));
    CHECK(downloads[31] == words({"/opt/bin/download", "https://huggingface.co/gpt2/resolve/main/merges.txt",
                                  "--output", "/opt/launcher/data/bpe/merges.txt", "--retries", "5"}));

    // extract: rm_downloaded: True removes the .zst once the .jsonl is in place.
    const auto& extractions = jobs[1].array_tasks;
    REQUIRE(extractions.size() == 30);
    CHECK(extractions[7] == words({"/opt/bin/decompress", "/opt/launcher/data/07.jsonl.zst", "--output",
                                   "/opt/launcher/data/07.jsonl", "--remove-input"}));

    // preprocess: NeMo's preprocess.py flags, my-gpt3_NN (the names NeMo's training configs list),
    // rm_extracted: True removes the .jsonl once the dataset is written.
    const auto& preprocessing = jobs[2].array_tasks;
    REQUIRE(preprocessing.size() == 30);
    CHECK(preprocessing[12] ==
          words({"/opt/bin/preprocess_data", "--input", "/opt/launcher/data/12.jsonl", "--output-prefix",
                 "/opt/launcher/data/my-gpt3_12", "--dataset-impl", "mmap", "--tokenizer-type", "GPT2BPETokenizer",
                 "--vocab-file", "/opt/launcher/data/bpe/vocab.json", "--merge-file", "/opt/launcher/data/bpe/merges.txt",
                 "--append-eod", "--workers", "1024", "--remove-input"}));
    CHECK(jobs[2].whole_node);  // every core of a node, as NeMo's $SLURM_CPUS_ON_NODE workers
    CHECK(jobs[2].cpus_per_task == 0);
    for (const JobSpec& job : jobs) {
      CAPTURE(job.step);
      CHECK(job.max_parallel_tasks == 30);  // run.node_array_size: NeMo's --array=<file_numbers>%30
      CHECK(job.time_limit == "4:00:00");
      CHECK(job.run_dependency == "singleton");
      CHECK(job.successors_need_success);
      CHECK_FALSE(job.uses_gpus);
      CHECK(job.results_dir == "/opt/launcher/results/download_gpt3_pile");
    }
    CHECK_FALSE(jobs[0].whole_node);
    CHECK_FALSE(jobs[1].whole_node);

    // The datasets are the ones NeMo's own training config (gpt3/5b, the tree's default) trains on.
    const Node& data_prefix = at_path(config, "training.model.data.data_prefix");
    REQUIRE(data_prefix.size() == 60);
    for (size_t shard = 0; shard < 30; ++shard) {
      CAPTURE(shard);
      CHECK(data_prefix.at(2 * shard + 1).as_string() ==
            flag_value(preprocessing[shard], "--output-prefix") + "_text_document");
    }
  }
}

TEST_CASE("the Pile's keys: file_numbers lists, download_the_pile, preprocess_data, rm_*, workers, tokenizer URLs") {
  SUBCASE("a list of ranges, rm_* off, a vocab URL not ending in json, workers set") {
    const Node config = nemo_pile_config(
        {"data_preparation.file_numbers='3,5-6'", "data_preparation.rm_downloaded=False",
         "data_preparation.rm_extracted=False", "data_preparation.the_pile_url=file:///srv/pile/",
         "data_preparation.download_vocab_url=https://h/vocab", "+data_preparation.workers=4", "data_dir=/d"});
    const std::vector<JobSpec> jobs = jobs_of(config);
    REQUIRE(jobs.size() == 3);
    REQUIRE(jobs[0].array_tasks.size() == 5);
    CHECK(jobs[0].array_tasks[1][1] == "file:///srv/pile/05.jsonl.zst");
    CHECK(jobs[0].array_tasks[3][3] == "/d/bpe/vocab.txt");  // NeMo: vocab.txt unless the URL ends in json
    CHECK(jobs[1].array_tasks[2] == words({"/opt/bin/decompress", "/d/06.jsonl.zst", "--output", "/d/06.jsonl"}));
    CHECK(jobs[2].array_tasks[0].back() == "4");  // --workers 4, nothing removed
    CHECK(flag_value(jobs[2].array_tasks[0], "--vocab-file") == "/d/bpe/vocab.txt");
    CHECK(flag_value(jobs[2].array_tasks[2], "--output-prefix") == "/d/my-gpt3_06");
    CHECK(jobs[2].cpus_per_task == 4);
    CHECK_FALSE(jobs[2].whole_node);
  }
  SUBCASE("a data_prefix key added to NeMo's option is filled with the outputs' blend") {
    const Node config = nemo_pile_config({"+data_preparation.data_prefix=null", "data_preparation.file_numbers='4,9'",
                                          "data_dir=/d"});
    const Node& blend = at_path(config, "data_preparation.data_prefix");
    REQUIRE(blend.size() == 4);
    CHECK(blend.at(0).as_double() == 1.0);
    CHECK(blend.at(1).as_string() == "/d/my-gpt3_04_text_document");
    CHECK(blend.at(3).as_string() == "/d/my-gpt3_09_text_document");
  }
  SUBCASE("NeMo's Llama keys: download_tokenizer_url, tokenizer_library: sentencepiece, tokenizer_model") {
    const std::vector<JobSpec> jobs = jobs_of(nemo_pile_config(
        {"data_preparation.tokenizer_type=null", "data_preparation.download_vocab_url=null",
         "data_preparation.download_merges_url=null", "+data_preparation.tokenizer_library=sentencepiece",
         "+data_preparation.download_tokenizer_url=https://h/tokenizer.model", "+data_preparation.tokenizer_save_dir=/t",
         "+data_preparation.tokenizer_model=/t/llama_tokenizer.model", "data_preparation.file_numbers=0-1"}));
    REQUIRE(jobs.size() == 3);
    REQUIRE(jobs[0].array_tasks.size() == 3);
    CHECK(jobs[0].array_tasks[2] == words({"/opt/bin/download", "https://h/tokenizer.model", "--output",
                                           "/t/llama_tokenizer.model", "--retries", "5"}));
    CHECK(flag_value(jobs[2].array_tasks[1], "--tokenizer-type") == "GPTSentencePieceTokenizer");
    CHECK(flag_value(jobs[2].array_tasks[1], "--tokenizer-model") == "/t/llama_tokenizer.model");
    CHECK(flag_value(jobs[2].array_tasks[1], "--vocab-file") == "<absent>");
  }
  SUBCASE("download_the_pile: False: only the tokenizer files are fetched before preprocessing") {
    const std::vector<JobSpec> jobs = jobs_of(nemo_pile_config({"data_preparation.download_the_pile=False"}));
    REQUIRE(jobs.size() == 2);
    CHECK(jobs[0].array_tasks.size() == 2);
    CHECK(jobs[1].step == "preprocess");
    CHECK(jobs[1].array_tasks.size() == 30);
  }
  SUBCASE("preprocess_data: False, no tokenizer URLs: download and extract only") {
    const std::vector<JobSpec> jobs =
        jobs_of(nemo_pile_config({"data_preparation.preprocess_data=False", "data_preparation.file_numbers=0",
                                  "data_preparation.download_vocab_url=null", "data_preparation.download_merges_url=null"}));
    REQUIRE(jobs.size() == 2);
    CHECK_FALSE(jobs[0].is_array());  // one shard: plain jobs
    CHECK(jobs[0].command[1] == "https://mystic.the-eye.eu/public/AI/pile/train/00.jsonl.zst");
    CHECK(jobs[1].step == "extract");
  }
  SUBCASE("nothing asked: nothing to submit") {
    CHECK(jobs_of(nemo_pile_config({"data_preparation.preprocess_data=False", "data_preparation.download_the_pile=False",
                                    "data_preparation.download_vocab_url=null",
                                    "data_preparation.download_merges_url=null"}))
              .empty());
  }
}

TEST_CASE("bad Pile values are refused, naming the key and what would be valid") {
  auto refused = [](std::vector<std::string> overrides, const std::string& message) {
    CAPTURE(message);
    CHECK_THROWS_WITH_AS(jobs_of(nemo_pile_config(std::move(overrides))), doctest::Contains(message.c_str()),
                         common::Error);
  };
  refused({"data_preparation.file_numbers='3-1'"},
          "data_preparation.file_numbers: the range '3-1' runs backwards; write it lowest first (1-3)");
  refused({"data_preparation.file_numbers=a"}, "data_preparation.file_numbers: 'a' in \"a\" is not a shard number");
  refused({"data_preparation.file_numbers='0-'"}, "data_preparation.file_numbers: '' in \"0-\" is not a shard number");
  refused({"data_preparation.file_numbers='1,,2'"}, "data_preparation.file_numbers: '' in \"1,,2\" is not a shard number");
  refused({"data_preparation.file_numbers='0-3,2'"}, "data_preparation.file_numbers: shard 2 is listed twice in \"0-3,2\"");
  refused({"data_preparation.file_numbers='0-999999'"},
          "data_preparation.file_numbers: \"0-999999\" names more than 10000 shards");
  refused({"data_preparation.file_numbers=null"}, "data_preparation.file_numbers is not set");
  refused({"data_preparation.the_pile_url=ftp://h/pile/"},
          "data_preparation.the_pile_url: 'ftp://h/pile/' is not an http://, https:// or file:// URL");
  refused({"data_preparation.the_pile_url=/srv/pile/"},
          "data_preparation.the_pile_url: '/srv/pile/' is not an http://, https:// or file:// URL");
  refused({"data_preparation.tokenizer_type=BertWordPieceCase"},
          "data_preparation.tokenizer_type: 'BertWordPieceCase' is not a tokenizer preprocess_data builds");
  refused({"data_preparation.tokenizer_type=null"}, "data_preparation.tokenizer_type is not set: preprocess_data needs it");
  refused({"data_preparation.tokenizer_type=GPTSentencePieceTokenizer"},
          "data_preparation.tokenizer_model is not set: a SentencePiece tokenizer needs its model file");
  refused({"data_preparation.vocab_save_dir=null"}, "data_preparation.vocab_save_dir is not set");
  refused({"data_preparation.run.node_array_size=0"}, "data_preparation.run.node_array_size must be a positive integer");
  refused({"data_preparation.rm_downloaded=maybe"}, "data_preparation.rm_downloaded");
  // The model type comes from the option's name (NeMo's data_preparation_config), else run.name.
  refused({"data_preparation_config=my_pile"}, "data_preparation_config 'my_pile' names none of NeMo's model types");
  refused({"data_preparation_config=null", "data_preparation.run.name=my_pile"},
          "data_preparation.run.name 'my_pile' names none of NeMo's model types");
}

TEST_CASE("NeMo's download_gpt3_pile through launcher main --dry-run: Slurm arrays and a local script, values quoted") {
  // The_pile_url with a space and a quote: every value reaches the script through shell_quote.
  const std::string url = "file:///srv/it's pile/";
  for (const std::string cluster_type : {"bcm", "local"}) {
    CAPTURE(cluster_type);
    TemporaryDirectory results;
    {
      // Quiet, and without the launcher.log sink each launch adds, whatever happens.
      const QuietLogger quiet;
      MainOptions options;
      options.overrides = {"stages=[data_preparation]", "cluster_type=" + cluster_type, "cluster=bcm",
                           "base_results_dir=" + results.path.string(), "data_dir=/d",
                           "data_preparation.the_pile_url=\"" + url + "\""};
      options.conf_dir = std::string(TEST_SOURCE_DIR) + "/tests/data/nemo_23.07/conf";
      options.dry_run = true;
      options.command_line = "launcher main --dry-run";
      std::ostringstream terminal;
      REQUIRE(launch_main(options, terminal) == 0);
    }
    const std::filesystem::path run = results.path / "download_gpt3_pile";
    const std::string prefix = "nemo-megatron-";  // bcm.yaml's job_name_prefix, local too (cluster=bcm)
    const std::string download =
        read_file(run / (prefix + "download_gpt3_pile_download_submission.sh"));
    const std::string extract =
        read_file(run / (prefix + "download_gpt3_pile_extract_submission.sh"));
    const std::string preprocess =
        read_file(run / (prefix + "download_gpt3_pile_preprocess_submission.sh"));
    CHECK(download.find(R"('file:///srv/it'\''s pile/29.jsonl.zst')") != std::string::npos);
    CHECK(download.find("--output /d/29.jsonl.zst") != std::string::npos);
    CHECK(extract.find("/d/29.jsonl.zst \\\n        --output /d/29.jsonl \\\n        --remove-input ;;") !=
          std::string::npos);
    CHECK(preprocess.find("--output-prefix /d/my-gpt3_29 \\\n") != std::string::npos);
    if (cluster_type == "bcm") {
      CHECK(download.find("#SBATCH --array=0-31%30\n") != std::string::npos);  // 30 shards, vocab, merges
      CHECK(extract.find("#SBATCH --array=0-29%30\n") != std::string::npos);
      CHECK(preprocess.find("#SBATCH --array=0-29%30\n") != std::string::npos);
      // Preprocessing takes whole nodes, as NeMo's (bcm.yaml's exclusive); downloads share them.
      CHECK(preprocess.find("#SBATCH --exclusive\n") != std::string::npos);
      CHECK(download.find("#SBATCH --exclusive\n") == std::string::npos);
      CHECK(extract.find("#SBATCH --dependency=afterok:") == std::string::npos);  // a dry run has no job ids
    } else {
      CHECK(download.find("# A job array of 32 tasks, run here one after the other") != std::string::npos);
      CHECK(preprocess.find("for task in $(seq 0 29); do") != std::string::npos);
    }
  }
}
