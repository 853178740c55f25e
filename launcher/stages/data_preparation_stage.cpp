// data_preparation → download / decompress / preprocess_data jobs; see
// data_preparation_stage.hpp. preprocess_data's flags follow Megatron-LM
// tools/preprocess_data.py (--input, --output-prefix, --json-keys, --tokenizer-type,
// --vocab-file, --merge-file, --append-eod, --workers, --log-interval); the download shape
// follows NeMo-Megatron-Launcher's data preparation (download, extract and preprocess as
// separate job arrays, conf/data_preparation/gpt3/download_gpt3_pile.yaml there) with shards
// named <prefix>_NN as NeMo names the Pile's; NeMo's Pile options themselves are read with
// their own keys (pile_jobs below, after NeMo-Megatron-Launcher's PileDataPreparation and
// dataprep_scripts/pile_dataprep/{download,extract,preprocess}.py).
#include "launcher/stages/data_preparation_stage.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <set>

#include "backend/common/ascii_case.hpp"
#include "backend/common/error.hpp"
#include "backend/common/sha256.hpp"
#include "backend/common/url_file_name.hpp"
#include "launcher/config/interpolate.hpp"
#include "launcher/config/scalar_text.hpp"

namespace launcher {

namespace fs = std::filesystem;

namespace {

constexpr const char* kSection = "data_preparation";

std::string key_of(std::string_view key) { return fmt::format("{}.{}", kSection, key); }

// A list of strings, or one string; absent or null: empty.
std::vector<std::string> text_list(const Node& stage, std::string_view key) {
  std::vector<std::string> items;
  const Node* value = find_set(stage, key);
  if (value == nullptr) return items;
  if (!value->is_list()) {
    items.push_back(scalar_text(*value, key_of(key)));
    return items;
  }
  for (size_t i = 0; i < value->size(); ++i) {
    const Node& item = value->at(i);
    items.push_back(item.is_null() ? std::string() : scalar_text(item, fmt::format("{}.{}", key_of(key), i)));
  }
  return items;
}

std::string optional_text(const Node& stage, std::string_view key) {
  const Node* value = find_set(stage, key);
  return value == nullptr ? std::string() : scalar_text(*value, key_of(key));
}

std::string required_text(const Node& stage, std::string_view key, std::string_view why) {
  std::string text = optional_text(stage, key);
  if (text.empty()) common::fail("{} is not set: {}", key_of(key), why);
  return text;
}

// A checksum as the downloader wants it: empty, or 64 hex digits (lowercased).
std::string checked_sha256(const std::string& text, const std::string& key) {
  if (text.empty()) return text;
  if (!common::is_sha256_hex(text)) {
    common::fail("{}: '{}' is not a SHA-256 digest (64 hexadecimal digits, as sha256sum prints)",
                 key, text);
  }
  return common::ascii_lowercase(text);
}

// An entry of file_urls: a URL, or an absolute local path (made a file:// URL).
std::string url_of(const std::string& entry, const std::string& key) {
  if (entry.find("://") != std::string::npos) return entry;
  if (!entry.starts_with("/")) {
    common::fail("{}: '{}' is neither a URL (https://..., file:///...) nor an absolute path", key, entry);
  }
  std::string url = "file://";
  for (const char byte : entry) {
    const auto c = static_cast<unsigned char>(byte);
    if (std::isalnum(c) || std::string_view("/-._~").find(static_cast<char>(c)) != std::string_view::npos) {
      url += static_cast<char>(c);
    } else {
      url += fmt::format("%{:02X}", c);
    }
  }
  return url;
}

bool is_compressed_name(const std::string& name) {
  for (const char* suffix : {".gz", ".zst", ".xz"}) {
    if (name.size() > std::string_view(suffix).size() && name.ends_with(suffix)) return true;
  }
  return false;
}

std::string without_compression_suffix(const std::string& name) {
  return name.substr(0, name.find_last_of('.'));
}

// <prefix> for one shard, <prefix>_00, <prefix>_01, ... for several (at least two digits).
std::string shard_prefix(const std::string& prefix, size_t index, size_t count) {
  if (count == 1) return prefix;
  const size_t width = std::max<size_t>(2, std::to_string(count - 1).size());
  return fmt::format("{}_{:0{}}", prefix, index, width);
}

int positive_integer(const Node& stage, std::string_view key, int fallback) {
  const int64_t value = integer_or(stage, kSection, key, fallback);
  if (value < 1 || value > 1'000'000) common::fail("{} must be a positive integer, got {}", key_of(key), value);
  return static_cast<int>(value);
}

int optional_positive_integer(const Node& stage, std::string_view key) {
  if (find_set(stage, key) == nullptr) return 0;
  return positive_integer(stage, key, 1);
}

// preprocess_data's flags shared by both shapes, after --input and --output-prefix.
std::vector<std::string> preprocess_flags(const Node& stage) {
  std::vector<std::string> flags;
  auto add = [&](const char* flag, std::string_view key) {
    const std::vector<std::string> values = text_list(stage, key);
    if (values.empty()) return;
    flags.push_back(flag);
    flags.insert(flags.end(), values.begin(), values.end());
  };
  add("--json-keys", "json_keys");
  add("--tokenizer-type", "tokenizer.type");
  add("--vocab-file", "tokenizer.vocab_file");
  add("--merge-file", "tokenizer.merge_file");
  add("--tokenizer-model", "tokenizer.model");  // SentencePiece (Llama's tokenizer.model)
  add("--vocab-size", "tokenizer.vocab_size");
  if (const Node* eod = find_set(stage, "append_eod"); eod && eod->as_bool(key_of("append_eod"))) {
    flags.push_back("--append-eod");
  }
  add("--workers", "workers");
  add("--log-interval", "log_interval");
  return flags;
}

// One job of the stage. Several tasks make a job array; one is a plain job.
JobSpec step_job(const StageContext& context, const std::string& step, const std::string& tool,
                 std::vector<std::vector<std::string>> tasks, int cpus_per_task, int max_parallel_tasks) {
  JobSpec job = job_from_run_section(kSection, context);
  if (!step.empty()) {
    job.step = step;
    job.job_name += fmt::format("_{}", step);
  }
  job.tool = tool;
  if (tasks.size() == 1) {
    job.command = std::move(tasks.front());
  } else {
    job.array_tasks = std::move(tasks);
    job.max_parallel_tasks = max_parallel_tasks;
  }
  job.uses_gpus = false;
  job.cpus_per_task = cpus_per_task;
  job.successors_need_success = true;  // the next step (or training) needs this one's files
  return job;
}

std::string first_json_key(const Node& stage) {
  const std::vector<std::string> keys = text_list(stage, "json_keys");
  return keys.empty() ? "text" : keys.front();
}

// The download shape: the jobs described in data_preparation_stage.hpp.
std::vector<JobSpec> download_and_preprocess_jobs(const StageContext& context, const Node& stage) {
  const std::vector<ShardPlan> shards = plan_shards(stage);
  if (shards.empty()) {
    spdlog::info("data_preparation: data_preparation.file_urls lists no files, nothing to submit");
    return {};
  }
  const fs::path bin = context.backend_bin_dir;
  const std::string retries = std::to_string(integer_or(stage, kSection, "retries", 5));
  if (std::stoll(retries) < 0) common::fail("{} must be at least 0, got {}", key_of("retries"), retries);
  auto download_task = [&](const std::string& url, const std::string& path, const std::string& sha256) {
    std::vector<std::string> task = {(bin / "download").string(), url, "--output", path};
    if (!sha256.empty()) task.insert(task.end(), {"--sha256", sha256});
    task.insert(task.end(), {"--retries", retries});
    return task;
  };

  std::vector<std::vector<std::string>> downloads;
  std::map<std::string, std::string> destinations;  // path → the key that downloads it
  auto claim = [&](const std::string& path, const std::string& key) {
    const auto [at, inserted] = destinations.emplace(path, key);
    if (!inserted) {
      common::fail("{} and {} would both download to {}: give the files different names",
                   at->second, key, path);
    }
  };
  for (size_t i = 0; i < shards.size(); ++i) {
    claim(shards[i].download_path, fmt::format("{}.{}", key_of("file_urls"), i));
    downloads.push_back(download_task(shards[i].url, shards[i].download_path, shards[i].sha256));
  }
  // The tokenizer's files, downloaded to where preprocess_data (and training) read them.
  struct TokenizerFile {
    const char* url_key;
    const char* sha_key;
    const char* file_key;
  };
  for (const TokenizerFile& file : {TokenizerFile{"vocab_url", "vocab_sha256", "tokenizer.vocab_file"},
                                    TokenizerFile{"merges_url", "merges_sha256", "tokenizer.merge_file"}}) {
    const std::string url_key = file.url_key, sha_key = file.sha_key;
    const std::string url = optional_text(stage, url_key);
    if (url.empty()) continue;
    const std::string path = required_text(stage, file.file_key, fmt::format("{} is downloaded there", key_of(url_key)));
    claim(path, key_of(url_key));
    downloads.push_back(download_task(url_of(url, key_of(url_key)), path,
                                      checked_sha256(optional_text(stage, sha_key), key_of(sha_key))));
  }

  const int max_parallel = optional_positive_integer(stage, "max_parallel_tasks");
  std::vector<JobSpec> jobs;
  jobs.push_back(step_job(context, "download", "download", std::move(downloads), 1, max_parallel));

  std::vector<std::vector<std::string>> decompressions;
  for (const ShardPlan& shard : shards) {
    if (!shard.decompressed) continue;
    decompressions.push_back({(bin / "decompress").string(), shard.download_path, "--output", shard.input_path});
  }
  if (!decompressions.empty()) {
    jobs.push_back(step_job(context, "decompress", "decompress", std::move(decompressions), 1, max_parallel));
  }

  const std::vector<std::string> flags = preprocess_flags(stage);
  std::vector<std::vector<std::string>> preprocessing;
  for (const ShardPlan& shard : shards) {
    std::vector<std::string> task = {(bin / "preprocess_data").string(), "--input", shard.input_path,
                                     "--output-prefix", shard.output_prefix};
    task.insert(task.end(), flags.begin(), flags.end());
    preprocessing.push_back(std::move(task));
  }
  jobs.push_back(step_job(context, "preprocess", "preprocess_data", std::move(preprocessing),
                          positive_integer(stage, "workers", 1), max_parallel));
  return jobs;
}

// ---- NeMo's Pile options (conf/data_preparation/<model>/download_<model>_pile.yaml there) ----
// NeMo-Megatron-Launcher's PileDataPreparation runs download.py, extract.py and preprocess.py
// (nemo_launcher/collections/dataprep_scripts/pile_dataprep/) as three Slurm job arrays over
// the file numbers: shard N is <the_pile_url><NN>.jsonl.zst (two digits at least), downloaded
// to ${data_dir}/NN.jsonl.zst, extracted to ${data_dir}/NN.jsonl and tokenized into
// ${data_dir}/my-<model type>_NN; the vocab and merges are fetched at launch into
// <vocab_save_dir>/vocab.json and <merges_save_dir>/merges.txt. Here the same files, from the
// same keys, through download / decompress / preprocess_data.

// preprocess_data's largest --workers (backend/data/preprocess_data.hpp kMaxWorkers): it runs
// min(--workers, the cores it may use), so this count means "every core of the task".
constexpr int kAllCoresWorkers = 1024;
constexpr size_t kMostPileShards = 10000;

bool is_pile_shape(const Node& stage) {
  return find(stage, "the_pile_url") != nullptr || find(stage, "file_numbers") != nullptr;
}

// NeMo's convert_file_numbers ("0-29", "0,3,7-9") without its silent cases: a reversed or
// open range, a non-number or a shard named twice is refused naming the key.
std::vector<int> pile_file_numbers(const Node& stage) {
  const std::string key = key_of("file_numbers");
  const std::string text = optional_text(stage, "file_numbers");
  if (text.empty()) {
    common::fail("{} is not set: give the Pile shards to prepare, e.g. \"0-29\" or \"0,3,7-9\"",
                 key);
  }
  auto number = [&](std::string_view item, std::string_view whole) {
    int value = 0;
    if (item.empty() || item.size() > 6 ||
        !std::all_of(item.begin(), item.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      common::fail(
          "{}: '{}' in \"{}\" is not a shard number (0, 1, ... 29 for the Pile's 30 shards; "
          "ranges are written 0-29, lists 0,3,7-9)",
          key, item, whole);
    }
    for (const char c : item) value = value * 10 + (c - '0');
    return value;
  };
  std::vector<int> numbers;
  std::set<int> seen;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    std::string_view item(text.data() + start, end - start);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    const size_t dash = item.find('-');
    int first = 0, last = 0;
    if (dash == std::string_view::npos) {
      first = last = number(item, text);
    } else {
      first = number(item.substr(0, dash), text);
      last = number(item.substr(dash + 1), text);
      if (last < first) {
        common::fail("{}: the range '{}' runs backwards; write it lowest first ({}-{})", key, item,
                     last, first);
      }
    }
    // Each shard is a task of three job arrays (Slurm's MaxArraySize is 1001 by default).
    if (numbers.size() + static_cast<size_t>(last - first) >= kMostPileShards) {
      common::fail("{}: \"{}\" names more than {} shards (the Pile has 30, 0-29)", key, text,
                   kMostPileShards);
    }
    for (int n = first; n <= last; ++n) {
      if (!seen.insert(n).second) {
        common::fail("{}: shard {} is listed twice in \"{}\"", key, n, text);
      }
      numbers.push_back(n);
    }
    start = end + 1;
  }
  return numbers;
}

std::string pile_url(const Node& stage) {
  const std::string key = key_of("the_pile_url");
  const std::string url = optional_text(stage, "the_pile_url");
  if (url.empty()) {
    common::fail("{} is not set: the directory URL the shards NN.jsonl.zst are downloaded from",
                 key);
  }
  if (!url.starts_with("https://") && !url.starts_with("http://") && !url.starts_with("file://")) {
    common::fail(
        "{}: '{}' is not an http://, https:// or file:// URL (the directory that holds "
        "00.jsonl.zst, 01.jsonl.zst, ...)",
        key, url);
  }
  return url;
}

// The model type in NeMo's output names my-<type>_NN: the first of NeMo's known types that the
// option's name contains (preprocess.py's get_model_type over data_config, the option's name).
std::string pile_model_type(const Node& config) {
  std::string name, used_key = "data_preparation.run.name";
  for (const char* key : {"data_preparation_config", "data_preparation.run.name"}) {
    if (const Node* value = find_set(config, key); value != nullptr && !value->is_container()) {
      name = scalar_text(*value, key);
      used_key = key;
      break;
    }
  }
  for (const char* type :
       {"t5", "bert", "gpt3", "llama", "falcon", "baichuan2", "chatglm", "mistral", "mixtral"}) {
    if (name.find(type) != std::string::npos) return type;
  }
  common::fail(
      "{} '{}' names none of NeMo's model types (gpt3, llama, t5, ...), which the Pile's "
      "outputs are named after (${{data_dir}}/my-<type>_NN, as NeMo's training configs list "
      "them): choose an option whose name has one, e.g. download_gpt3_pile",
      used_key, name);
}

// preprocess.py's output_prefix, the names NeMo's training configs list in data_prefix.
std::string pile_output_prefix(const std::string& data_dir, const std::string& model_type,
                               int number) {
  return (fs::path(data_dir) / fmt::format("my-{}_{:02d}", model_type, number)).string();
}

std::string pile_data_dir(const Node& config) {
  const Node* value = find_set(config, "data_dir");
  if (value == nullptr) {
    common::fail("data_dir is not set: the Pile's shards and datasets are written there");
  }
  return scalar_text(*value, "data_dir");
}

bool switch_on(const Node& stage, std::string_view key, bool fallback) {
  const Node* value = find_set(stage, key);
  return value == nullptr ? fallback : value->as_bool(key_of(key));
}

std::vector<JobSpec> pile_jobs(const StageContext& context, const Node& stage) {
  const bool download_the_pile = switch_on(stage, "download_the_pile", false);
  const bool preprocess = switch_on(stage, "preprocess_data", false);
  const std::string data_dir = pile_data_dir(context.config);
  const fs::path bin = context.backend_bin_dir;
  const int64_t retries = integer_or(stage, kSection, "retries", 5);
  if (retries < 0) common::fail("{} must be at least 0, got {}", key_of("retries"), retries);
  const int max_parallel = [&] {
    const Node* value = find_set(stage, "run.node_array_size");
    if (value == nullptr) return 0;
    return positive_integer(stage, "run.node_array_size", 1);
  }();
  std::vector<int> numbers;
  std::string url;
  if (download_the_pile || preprocess) numbers = pile_file_numbers(stage);
  if (download_the_pile) url = pile_url(stage);
  // Shard names as NeMo writes them: {:02d}.
  auto shard = [&](int number, const char* suffix) {
    return (fs::path(data_dir) / fmt::format("{:02d}{}", number, suffix)).string();
  };
  std::vector<JobSpec> jobs;

  std::vector<std::vector<std::string>> downloads;
  auto download_task = [&](const std::string& from, const std::string& to) {
    return std::vector<std::string>{(bin / "download").string(), from, "--output", to, "--retries",
                                    std::to_string(retries)};
  };
  if (download_the_pile) {
    for (const int number : numbers) {
      downloads.push_back(download_task(fmt::format("{}{:02d}.jsonl.zst", url, number),
                                        shard(number, ".jsonl.zst")));
    }
  }
  // The tokenizer's files, where NeMo's setup_folder_and_data saves them (vocab.txt for a
  // vocab URL not ending in json) and preprocess.py reads them.
  const std::string vocab_url = optional_text(stage, "download_vocab_url");
  const std::string merges_url = optional_text(stage, "download_merges_url");
  const std::string vocab_name =
      vocab_url.empty() || vocab_url.ends_with("json") ? "vocab.json" : "vocab.txt";
  auto saved = [&](const char* dir_key, const std::string& name, std::string_view why) {
    return (fs::path(required_text(stage, dir_key, why)) / name).string();
  };
  if (!vocab_url.empty()) {
    downloads.push_back(
        download_task(url_of(vocab_url, key_of("download_vocab_url")),
                      saved("vocab_save_dir", vocab_name, "download_vocab_url is saved there")));
  }
  if (!merges_url.empty()) {
    downloads.push_back(download_task(
        url_of(merges_url, key_of("download_merges_url")),
        saved("merges_save_dir", "merges.txt", "download_merges_url is saved there")));
  }
  // NeMo's Llama options: download_tokenizer_url → <tokenizer_save_dir>/llama_tokenizer.model,
  // the name NeMo's setup_folder_and_data gives it (their tokenizer_model points there).
  if (const std::string tokenizer_url = optional_text(stage, "download_tokenizer_url");
      !tokenizer_url.empty()) {
    downloads.push_back(download_task(url_of(tokenizer_url, key_of("download_tokenizer_url")),
                                      saved("tokenizer_save_dir", "llama_tokenizer.model",
                                            "download_tokenizer_url is saved there")));
  }
  if (!downloads.empty()) {
    jobs.push_back(
        step_job(context, "download", "download", std::move(downloads), 1, max_parallel));
  }

  if (download_the_pile) {
    const bool remove_downloaded = switch_on(stage, "rm_downloaded", false);
    std::vector<std::vector<std::string>> extractions;
    for (const int number : numbers) {
      std::vector<std::string> task = {(bin / "decompress").string(), shard(number, ".jsonl.zst"),
                                       "--output", shard(number, ".jsonl")};
      if (remove_downloaded) task.push_back("--remove-input");
      extractions.push_back(std::move(task));
    }
    jobs.push_back(
        step_job(context, "extract", "decompress", std::move(extractions), 1, max_parallel));
  }

  if (preprocess) {
    const std::string model_type = pile_model_type(context.config);
    // NeMo's Llama options set no tokenizer_type but tokenizer_library: sentencepiece, whose
    // tokenizer there is the model's pieces with eos as the end of document: Megatron's
    // GPTSentencePieceTokenizer here.
    std::string tokenizer_type = optional_text(stage, "tokenizer_type");
    if (tokenizer_type.empty() && optional_text(stage, "tokenizer_library") == "sentencepiece") {
      tokenizer_type = "GPTSentencePieceTokenizer";
    }
    if (tokenizer_type.empty()) {
      common::fail(
          "{} is not set: preprocess_data needs it (GPT2BPETokenizer, or tokenizer_library: "
          "sentencepiece with tokenizer_model)",
          key_of("tokenizer_type"));
    }
    std::vector<std::string> tokenizer_flags = {"--tokenizer-type", tokenizer_type};
    if (tokenizer_type == "GPT2BPETokenizer") {
      tokenizer_flags.insert(
          tokenizer_flags.end(),
          {"--vocab-file",
           saved("vocab_save_dir", vocab_name, "preprocess_data reads the vocab there"),
           "--merge-file",
           saved("merges_save_dir", "merges.txt", "preprocess_data reads the merges there")});
    } else if (tokenizer_type == "GPTSentencePieceTokenizer" ||
               tokenizer_type == "Llama2Tokenizer" || tokenizer_type == "SentencePieceTokenizer") {
      tokenizer_flags.insert(
          tokenizer_flags.end(),
          {"--tokenizer-model", required_text(stage, "tokenizer_model",
                                              "a SentencePiece tokenizer needs its model file")});
    } else {
      common::fail(
          "{}: '{}' is not a tokenizer preprocess_data builds (GPT2BPETokenizer, "
          "GPTSentencePieceTokenizer, Llama2Tokenizer or SentencePieceTokenizer)",
          key_of("tokenizer_type"), tokenizer_type);
    }
    // NeMo passes --workers $SLURM_CPUS_ON_NODE on a node of its own; `workers` (ours) sets a
    // count and the CPUs asked for. Without it every core the task may run on is used:
    // preprocess_data runs min(--workers, its cores), and the job asks for whole nodes.
    const bool whole_node = find_set(stage, "workers") == nullptr;
    const int workers = whole_node ? kAllCoresWorkers : positive_integer(stage, "workers", 1);
    const bool remove_extracted = switch_on(stage, "rm_extracted", false);
    std::vector<std::vector<std::string>> preprocessing;
    for (const int number : numbers) {
      std::vector<std::string> task = {(bin / "preprocess_data").string(),
                                       "--input",
                                       shard(number, ".jsonl"),
                                       "--output-prefix",
                                       pile_output_prefix(data_dir, model_type, number),
                                       "--dataset-impl",
                                       "mmap"};
      task.insert(task.end(), tokenizer_flags.begin(), tokenizer_flags.end());
      task.insert(task.end(), {"--append-eod", "--workers", std::to_string(workers)});
      if (remove_extracted) task.push_back("--remove-input");
      preprocessing.push_back(std::move(task));
    }
    JobSpec job = step_job(context, "preprocess", "preprocess_data", std::move(preprocessing),
                           whole_node ? 0 : workers, max_parallel);
    job.whole_node = whole_node;
    jobs.push_back(std::move(job));
  }
  if (jobs.empty()) {
    spdlog::info(
        "data_preparation: download_the_pile and preprocess_data are false and no tokenizer "
        "URL is set, nothing to submit");
  }
  return jobs;
}

}  // namespace

std::vector<ShardPlan> plan_shards(const Node& stage) {
  const std::vector<std::string> entries = text_list(stage, "file_urls");
  std::vector<std::string> checksums = text_list(stage, "file_sha256");
  if (!checksums.empty() && checksums.size() != entries.size()) {
    common::fail("{} has {} entries but {} has {}: give one checksum (or null) per file", key_of("file_sha256"),
                 checksums.size(), key_of("file_urls"), entries.size());
  }
  if (entries.empty()) return {};
  const std::string download_dir = required_text(stage, "download_dir", "the files are downloaded there");
  const std::string output_prefix = required_text(stage, "output_prefix", "the datasets are written there");
  const Node* decompress_node = find_set(stage, "decompress");
  const bool decompress = decompress_node == nullptr || decompress_node->as_bool(key_of("decompress"));
  std::vector<ShardPlan> shards;
  for (size_t i = 0; i < entries.size(); ++i) {
    const std::string key = fmt::format("{}.{}", key_of("file_urls"), i);
    ShardPlan shard;
    shard.url = url_of(entries[i], key);
    const std::string name = common::url_file_name(shard.url);
    if (name.empty()) common::fail("{}: '{}' names no file (its path ends in '/')", key, entries[i]);
    if (!checksums.empty()) {
      shard.sha256 = checked_sha256(checksums[i], fmt::format("{}.{}", key_of("file_sha256"), i));
    }
    shard.download_path = (fs::path(download_dir) / name).string();
    shard.decompressed = decompress && is_compressed_name(name);
    shard.input_path = shard.decompressed
                           ? (fs::path(download_dir) / without_compression_suffix(name)).string()
                           : shard.download_path;
    shard.output_prefix = shard_prefix(output_prefix, i, entries.size());
    shards.push_back(std::move(shard));
  }
  return shards;
}

Node data_preparation_blend(const Node& stage) {
  Node blend = Node::list();
  const std::string suffix = fmt::format("_{}_document", first_json_key(stage));
  if (find_set(stage, "file_urls") != nullptr) {
    for (const ShardPlan& shard : plan_shards(stage)) {
      blend.push_back(Node::floating(1.0));
      blend.push_back(Node::string(shard.output_prefix + suffix));
    }
  } else if (!text_list(stage, "input").empty()) {
    blend.push_back(Node::floating(1.0));
    blend.push_back(Node::string(required_text(stage, "output_prefix", "the dataset is written there") + suffix));
  }
  return blend;
}

void fill_data_preparation_blend(ComposedConfig& composed) {
  Node* target = find(composed.config, "data_preparation.data_prefix");
  if (target == nullptr || !(target->is_null() || target->is_missing())) return;
  Node copy = composed.config;
  *find(copy, "data_preparation.data_prefix") = Node::list();  // references to it resolve
  Node resolved;
  try {
    resolved = resolve(copy, ResolveContext{composed.choices});
  } catch (const common::Error&) {
    return;  // the launch's own resolve reports the problem, with its usual message
  }
  const Node& stage = at_path(resolved, kSection);
  Node blend = Node::list();
  if (!is_pile_shape(stage)) {
    blend = data_preparation_blend(stage);
  } else if (switch_on(stage, "preprocess_data", false)) {
    // NeMo's Pile options have no data_prefix key; one added (+data_preparation.data_prefix=null)
    // gets the list NeMo's training configs write by hand: 1.0,
    // ${data_dir}/my-<type>_NN_text_document.
    const std::string data_dir = pile_data_dir(resolved), model_type = pile_model_type(resolved);
    for (const int number : pile_file_numbers(stage)) {
      blend.push_back(Node::floating(1.0));
      blend.push_back(
          Node::string(pile_output_prefix(data_dir, model_type, number) + "_text_document"));
    }
  }
  blend.set_location(target->location());
  *target = std::move(blend);
}

std::vector<JobSpec> build_data_preparation_jobs(const StageContext& context) {
  const Node& stage = at_path(context.config, kSection);
  if (is_pile_shape(stage)) return pile_jobs(context, stage);
  if (find_set(stage, "file_urls") != nullptr) return download_and_preprocess_jobs(context, stage);
  const std::vector<std::string> inputs = text_list(stage, "input");
  if (inputs.empty()) {
    spdlog::info("data_preparation: data_preparation.input lists no files, nothing to submit");
    return {};
  }
  std::vector<std::string> command = {(context.backend_bin_dir / "preprocess_data").string(), "--input"};
  command.insert(command.end(), inputs.begin(), inputs.end());
  command.insert(command.end(), {"--output-prefix",
                                 required_text(stage, "output_prefix", "the dataset is written there")});
  const std::vector<std::string> flags = preprocess_flags(stage);
  command.insert(command.end(), flags.begin(), flags.end());
  std::vector<JobSpec> jobs;
  jobs.push_back(step_job(context, "", "preprocess_data", {command}, positive_integer(stage, "workers", 1), 0));
  return jobs;
}

}  // namespace launcher
