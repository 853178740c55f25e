// End to end on the local cluster: `launcher main` with data_preparation=gpt3/download_and_preprocess
// over file:// URLs of .jsonl.xz shards (made with Debian's xz) runs the real download,
// decompress and preprocess_data jobs one after the other and leaves Megatron .bin/.idx files
// in data_dir, byte for byte what preprocess_data makes of the uncompressed originals. A failed
// download stops the steps after it (afterok), the training stage included; the seed workflow
// is one command. NeMo 23.07's own download_gpt3_pile option, from its unchanged conf tree, with
// the_pile_url a file:// directory of .jsonl.zst shards (made with Debian's zstd), does the same
// with NeMo's names (NN.jsonl.zst → NN.jsonl → my-gpt3_NN_text_document). The prepared files
// train through NeMo's per-split data_prefix {train, validation, test}.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "launcher/process.hpp"
#include "launcher/run_status.hpp"
#include "temporary_directory.hpp"
#include "test_files.hpp"

namespace fs = std::filesystem;
using test_support::TemporaryDirectory;

namespace {

using test_support::kGpt2Vocab;
using test_support::kGpt2Merges;

using test_support::kLauncher;

using test_support::read_file;

// A small English corpus: `documents` JSON lines, different per shard.
void write_shard(const fs::path& path, int shard, int documents) {
  static const char* kSentences[] = {
      "The committee met on Tuesday to discuss the budget for the coming year.",
      "Rain is expected across the northern region until the weekend.",
      "She opened the window and listened to the birds in the garden.",
      "A new bridge will connect the two halves of the old town by spring.",
      "Researchers measured the temperature of the lake every morning for a month."};
  std::ofstream out(path);
  for (int i = 0; i < documents; ++i) {
    out << fmt::format(R"({{"text": "Shard {} document {}. {} {}", "id": {}}})", shard, i,
                       kSentences[(i + shard) % 5], kSentences[(3 * i + 1) % 5], i)
        << "\n";
  }
}

std::string sha256sum(const fs::path& path) {
  const auto run = launcher::run_and_capture({"sha256sum", path.string()});
  REQUIRE(run.exit_code == 0);
  return run.output.substr(0, 64);
}

struct Corpus {
  fs::path source;  // the .jsonl originals and their .jsonl.xz
  fs::path data;    // data_dir
  fs::path results;  // base_results_dir
};

Corpus make_corpus(const fs::path& root) {
  Corpus corpus{root / "source", root / "data", root / "results"};
  fs::create_directories(corpus.source);
  for (int shard = 0; shard < 2; ++shard) {
    const fs::path jsonl = corpus.source / fmt::format("shard{}.jsonl", shard);
    write_shard(jsonl, shard, 40 + 7 * shard);
    const auto xz = launcher::run_and_capture({"xz", "--keep", "--force", jsonl.string()});
    REQUIRE_MESSAGE(xz.exit_code == 0, "xz (Debian: xz-utils) failed: " << xz.output);
  }
  return corpus;
}

std::vector<std::string> prepare_command(const Corpus& corpus, std::vector<std::string> extra) {
  std::vector<std::string> argv = {
      kLauncher, "main", "stages=[data_preparation]", "data_preparation=gpt3/download_and_preprocess",
      "cluster_type=local", "base_results_dir=" + corpus.results.string(), "data_dir=" + corpus.data.string(),
      // One file:// URL and one plain absolute path (made a file:// URL by the stage).
      fmt::format("data_preparation.file_urls=[file://{},{}]", (corpus.source / "shard0.jsonl.xz").string(),
                  (corpus.source / "shard1.jsonl.xz").string()),
      fmt::format("data_preparation.file_sha256=[{},null]", sha256sum(corpus.source / "shard0.jsonl.xz")),
      "data_preparation.vocab_url=file://" + kGpt2Vocab,
      "data_preparation.merges_url=file://" + kGpt2Merges,
      "data_preparation.workers=1"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

}  // namespace

TEST_CASE("download_and_preprocess over file:// .jsonl.xz shards leaves Megatron .bin/.idx in data_dir") {
  TemporaryDirectory temporary;
  const Corpus corpus = make_corpus(temporary.path);
  const auto run = launcher::run_and_capture(prepare_command(corpus, {}));
  INFO(run.output);
  REQUIRE(run.exit_code == 0);

  // The steps ran in order, each a job of its own with its own log.
  const size_t downloaded = run.output.find("data_preparation.download: local job");
  const size_t decompressed = run.output.find("data_preparation.decompress: local job");
  const size_t preprocessed = run.output.find("data_preparation.preprocess: local job");
  REQUIRE(downloaded != std::string::npos);
  REQUIRE(decompressed != std::string::npos);
  REQUIRE(preprocessed != std::string::npos);
  CHECK(downloaded < decompressed);
  CHECK(decompressed < preprocessed);
  CHECK(run.output.find("sha256 " + sha256sum(corpus.source / "shard0.jsonl.xz") + " verified") !=
        std::string::npos);
  const fs::path results = corpus.results / "prepare_gpt3";
  const auto records = launcher::read_job_records(results);
  REQUIRE(records.size() == 3);
  CHECK(records[0].stage == "data_preparation.download");
  CHECK(records[1].stage == "data_preparation.decompress");
  CHECK(records[2].stage == "data_preparation.preprocess");
  for (const auto& record : records) {
    CHECK(record.exit_code == 0);
    CHECK(fs::is_regular_file(record.log_file));
  }

  // Files where the config says, nothing half-written left behind.
  CHECK(read_file(corpus.data / "bpe/vocab.json") == read_file(kGpt2Vocab));
  CHECK(read_file(corpus.data / "bpe/merges.txt") == read_file(kGpt2Merges));
  for (int shard = 0; shard < 2; ++shard) {
    CAPTURE(shard);
    CHECK(read_file(corpus.data / fmt::format("downloads/shard{}.jsonl", shard)) ==
          read_file(corpus.source / fmt::format("shard{}.jsonl", shard)));
  }
  for (const auto& entry : fs::recursive_directory_iterator(corpus.data)) {
    const std::string name = entry.path().filename().string();
    CAPTURE(name);
    CHECK(name.find(".part") == std::string::npos);
    CHECK(name.find(".tmp") == std::string::npos);
  }

  // The datasets are what preprocess_data makes of the uncompressed originals, byte for byte.
  for (int shard = 0; shard < 2; ++shard) {
    CAPTURE(shard);
    const fs::path reference = temporary.path / fmt::format("reference{}", shard);
    const auto direct = launcher::run_and_capture(
        {std::string(TEST_BIN_DIR) + "/preprocess_data", "--input",
         (corpus.source / fmt::format("shard{}.jsonl", shard)).string(), "--output-prefix", reference.string(),
         "--json-keys", "text", "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file",
         kGpt2Vocab, "--merge-file", kGpt2Merges,
         "--append-eod", "--workers", "1"});
    REQUIRE_MESSAGE(direct.exit_code == 0, direct.output);
    const std::string prefix = (corpus.data / fmt::format("meg-gpt2_0{}_text_document", shard)).string();
    for (const char* extension : {".bin", ".idx"}) {
      CAPTURE(extension);
      REQUIRE(fs::is_regular_file(prefix + extension));
      CHECK(fs::file_size(prefix + extension) > 0);
      CHECK(read_file(prefix + extension) == read_file(reference.string() + "_text_document" + extension));
    }
  }

  // NeMo's per-split data_prefix trains on these files: shard 0 the training split, shard 1
  // validation and test, each its own blend (--train/valid/test-data-path).
  const std::string shard0 = (corpus.data / "meg-gpt2_00_text_document").string();
  const std::string shard1 = (corpus.data / "meg-gpt2_01_text_document").string();
  const auto trained = launcher::run_and_capture(
      {kLauncher, "main", "stages=[training]", "cluster_type=local",
       "base_results_dir=" + corpus.results.string(), "data_dir=" + corpus.data.string(),
       "training.run.name=per_split", "training.trainer.num_nodes=1", "training.trainer.devices=1",
       "training.trainer.precision=32", "training.trainer.max_steps=2",
       "training.trainer.val_check_interval=2", "training.trainer.limit_val_batches=1",
       "training.model.num_layers=1", "training.model.hidden_size=32",
       "training.model.num_attention_heads=2", "training.model.encoder_seq_length=16",
       "training.model.global_batch_size=2", "training.model.micro_batch_size=1",
       "training.model.data.data_impl=mmap",
       "training.model.data.data_prefix={train:[" + shard0 + "],validation:[" + shard1 +
           "],test:[1.0," + shard1 + "]}"});
  INFO(trained.output);
  REQUIRE(trained.exit_code == 0);
  const auto training_records = launcher::read_job_records(corpus.results / "per_split");
  REQUIRE(training_records.size() == 1);
  const std::string training_log = read_file(training_records[0].log_file);
  CHECK(training_log.find("validation loss at iteration 2 on validation set") != std::string::npos);
  CHECK(training_log.find("on test set") != std::string::npos);
  const std::string script = read_file(corpus.results / "per_split" / "per_split_submission.sh");
  REQUIRE(!script.empty());
  CHECK(script.find("--train-data-path " + shard0) != std::string::npos);
  CHECK(script.find("--valid-data-path " + shard1) != std::string::npos);
  CHECK(script.find("--test-data-path 1 " + shard1) != std::string::npos);

  // Launching again finds everything in place: nothing is downloaded or decompressed twice.
  const auto again = launcher::run_and_capture(prepare_command(corpus, {}));
  INFO(again.output);
  CHECK(again.exit_code == 0);
  CHECK(again.output.find("shard0.jsonl.xz is already there") != std::string::npos);
  CHECK(again.output.find("shard1.jsonl is already there; not decompressing") != std::string::npos);
}

TEST_CASE("a failed download stops the steps after it and the training that needs them (afterok)") {
  TemporaryDirectory temporary;
  const Corpus corpus = make_corpus(temporary.path);
  fs::remove(corpus.source / "shard1.jsonl.xz");
  const auto run = launcher::run_and_capture(prepare_command(
      corpus, {"stages=[data_preparation,training]", "training.model.data.data_impl=mmap",
               "training.model.data.data_prefix=${data_preparation.data_prefix}", "training.trainer.max_steps=2",
               "training.model.num_layers=1", "training.model.hidden_size=32", "training.model.num_attention_heads=2",
               "training.model.encoder_seq_length=16", "training.model.global_batch_size=2",
               "training.model.micro_batch_size=1"}));
  INFO(run.output);
  CHECK(run.exit_code == 2);  // the download's exit status
  CHECK(run.output.find("download file://" + (corpus.source / "shard1.jsonl.xz").string() + ": curl error 37") !=
        std::string::npos);
  // The other tasks of the array still ran (as on Slurm); the steps after it did not.
  CHECK(fs::is_regular_file(corpus.data / "downloads/shard0.jsonl.xz"));
  CHECK(fs::is_regular_file(corpus.data / "bpe/merges.txt"));
  for (const char* label : {"data_preparation.decompress: not run", "data_preparation.preprocess: not run",
                            "training: not run"}) {
    CAPTURE(label);
    CHECK(run.output.find(label) != std::string::npos);
  }
  CHECK_FALSE(fs::exists(corpus.data / "meg-gpt2_00_text_document.bin"));
  CHECK(launcher::read_job_records(corpus.results / "prepare_gpt3").size() == 1);
  CHECK_FALSE(fs::exists(corpus.results / "gpt3_126m" / "jobs.jsonl"));
}

TEST_CASE("the seed workflow is one launcher command: OSCAR + GPT-2 vocab/merges → meg-gpt2_text_document → training") {
  TemporaryDirectory temporary;
  const auto run = launcher::run_and_capture(
      {kLauncher, "main", "stages=[data_preparation,training]", "data_preparation=gpt3/download_and_preprocess",
       "training.model.data.data_impl=mmap", "training.model.data.data_prefix=${data_preparation.data_prefix}",
       "cluster_type=bcm", "base_results_dir=" + (temporary.path / "results").string(),
       "data_dir=" + (temporary.path / "data").string(), "--dry-run"});
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  const fs::path prepare = temporary.path / "results/prepare_gpt3";
  const std::string download = read_file(prepare / "nemo-megatron-prepare_gpt3_download_submission.sh");
  for (const char* url : {"https://huggingface.co/bigscience/misc-test-data/resolve/main/stas/oscar-1GB.jsonl.xz",
                          "https://s3.amazonaws.com/models.huggingface.co/bert/gpt2-vocab.json",
                          "https://s3.amazonaws.com/models.huggingface.co/bert/gpt2-merges.txt"}) {
    CAPTURE(url);
    CHECK(download.find(url) != std::string::npos);
  }
  CHECK(download.find("#SBATCH --array=0-2\n") != std::string::npos);
  const std::string preprocess = read_file(prepare / "nemo-megatron-prepare_gpt3_preprocess_submission.sh");
  CHECK(preprocess.find("--output-prefix " + (temporary.path / "data/meg-gpt2").string() + " \\\n") != std::string::npos);
  const std::string training = read_file(temporary.path / "results/gpt3_126m/nemo-megatron-gpt3_126m_submission.sh");
  CHECK(training.find("--data-path 1 " + (temporary.path / "data/meg-gpt2_text_document").string() + " \\\n") !=
        std::string::npos);
  CHECK(training.find("--vocab-file " + (temporary.path / "data/bpe/vocab.json").string()) != std::string::npos);
}

TEST_CASE("NeMo's download_gpt3_pile over a file:// directory of .jsonl.zst shards: my-gpt3_NN datasets") {
  TemporaryDirectory temporary;
  const fs::path pile = temporary.path / "pile";  // the_pile_url's directory: 00.jsonl.zst, 01.jsonl.zst
  const fs::path data = temporary.path / "data";
  const fs::path results = temporary.path / "results";
  fs::create_directories(pile);
  for (int shard = 0; shard < 2; ++shard) {
    const fs::path jsonl = temporary.path / fmt::format("original{}.jsonl", shard);
    write_shard(jsonl, shard, 30 + 9 * shard);
    const auto zstd = launcher::run_and_capture(
        {"zstd", "-q", "-f", jsonl.string(), "-o", (pile / fmt::format("{:02d}.jsonl.zst", shard)).string()});
    REQUIRE_MESSAGE(zstd.exit_code == 0, "zstd (Debian: zstd) failed: " << zstd.output);
  }
  auto launch = [&](std::vector<std::string> extra) {
    std::vector<std::string> argv = {
        kLauncher, "main", "--config-dir", (fs::path(TEST_SOURCE_DIR) / "tests/data/nemo_23.07/conf").string(),
        "stages=[data_preparation]",
        // NeMo's tree has only cluster/bcm.yaml; the local cluster type runs with it.
        "cluster_type=local", "cluster=bcm", "base_results_dir=" + results.string(), "data_dir=" + data.string(),
        "data_preparation.the_pile_url=file://" + pile.string() + "/", "data_preparation.file_numbers=0-1",
        "data_preparation.download_vocab_url=file://" + kGpt2Vocab,
        "data_preparation.download_merges_url=file://" + kGpt2Merges};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return launcher::run_and_capture(argv);
  };
  const auto run = launch({});
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  const size_t downloaded = run.output.find("data_preparation.download: local job");
  const size_t extracted = run.output.find("data_preparation.extract: local job");
  const size_t preprocessed = run.output.find("data_preparation.preprocess: local job");
  REQUIRE(downloaded != std::string::npos);
  REQUIRE(extracted != std::string::npos);
  REQUIRE(preprocessed != std::string::npos);
  CHECK(downloaded < extracted);
  CHECK(extracted < preprocessed);
  const auto records = launcher::read_job_records(results / "download_gpt3_pile");
  REQUIRE(records.size() == 3);
  for (const auto& record : records) CHECK(record.exit_code == 0);

  CHECK(read_file(data / "bpe/vocab.json") == read_file(kGpt2Vocab));
  CHECK(read_file(data / "bpe/merges.txt") == read_file(kGpt2Merges));
  auto check_datasets = [&] {
    for (int shard = 0; shard < 2; ++shard) {
      CAPTURE(shard);
      const fs::path reference = temporary.path / fmt::format("reference{}", shard);
      const auto direct = launcher::run_and_capture(
          {std::string(TEST_BIN_DIR) + "/preprocess_data", "--input",
           (temporary.path / fmt::format("original{}.jsonl", shard)).string(), "--output-prefix", reference.string(),
           "--json-keys", "text", "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file",
           kGpt2Vocab, "--merge-file", kGpt2Merges,
           "--append-eod", "--workers", "1"});
      REQUIRE_MESSAGE(direct.exit_code == 0, direct.output);
      CHECK(direct.output.find(fmt::format("{} documents", 30 + 9 * shard)) != std::string::npos);
      const std::string prefix = (data / fmt::format("my-gpt3_0{}_text_document", shard)).string();
      for (const char* extension : {".bin", ".idx"}) {
        CAPTURE(extension);
        REQUIRE(fs::is_regular_file(prefix + extension));
        CHECK(read_file(prefix + extension) == read_file(reference.string() + "_text_document" + extension));
      }
    }
  };
  check_datasets();
  // rm_downloaded and rm_extracted (True in NeMo's option): neither the .zst nor the .jsonl is left.
  for (const char* name : {"00.jsonl.zst", "01.jsonl.zst", "00.jsonl", "01.jsonl"}) {
    CAPTURE(name);
    CHECK_FALSE(fs::exists(data / name));
  }
  CHECK(fs::is_regular_file(pile / "00.jsonl.zst"));  // the source is only read

  // With both False the downloads and the extracted shards stay, and the datasets are the same.
  const auto kept = launch({"data_preparation.rm_downloaded=False", "data_preparation.rm_extracted=False"});
  INFO(kept.output);
  REQUIRE(kept.exit_code == 0);
  CHECK(read_file(data / "01.jsonl.zst") == read_file(pile / "01.jsonl.zst"));
  CHECK(read_file(data / "01.jsonl") == read_file(temporary.path / "original1.jsonl"));
  check_datasets();
}
