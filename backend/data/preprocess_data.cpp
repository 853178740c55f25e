// preprocess_data's flags, the reader → workers → ordered writer pipeline, and --merge
// (behaviour and the choices where Megatron stops with a traceback in preprocess_data.hpp).
#include "backend/data/preprocess_data.hpp"

#include <sched.h>
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <filesystem>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>

#include "backend/common/command_line.hpp"
#include "backend/common/error.hpp"
#include "backend/common/flag_rules.hpp"
#include "backend/data/compressed_input.hpp"
#include "backend/data/indexed_dataset.hpp"
#include "backend/data/unicode_text.hpp"

namespace backend {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The value rules of the flags taken (common/flag_rules.hpp).
constexpr common::FlagRule kPreprocessFlagRules[] = {
    common::text_flag("--input"),
    common::text_flag("--json-keys"),
    common::text_flag("--dataset-impl"),
    common::text_flag("--lang"),
    common::text_flag("--tokenizer-type"),
    common::text_flag("--vocab-file"),
    common::text_flag("--merge-file"),
    common::text_flag("--tokenizer-model"),
    common::integer_flag("--vocab-size", 1, std::numeric_limits<int32_t>::max() - 1,
                         "token ids are 32-bit, and NullTokenizer adds its EOD"),
    common::integer_flag("--vocab-extra-ids", 0, std::numeric_limits<int32_t>::max()),
    common::text_flag("--output-prefix"),
    common::integer_flag("--workers", 1, kMaxWorkers),
    common::integer_flag("--partitions", 1, std::numeric_limits<int32_t>::max()),
    common::integer_flag("--log-interval", 1),
    // 1 TiB: a line is held whole in memory, about 4 times over while it is parsed.
    common::integer_flag("--max-line-bytes", 1, int64_t(1) << 40),
};

// Megatron flags of tools/preprocess_data.py (and its tokenizer group) that are refused.
constexpr common::RefusedFlag kRefusedFlags[] = {
    {"--split-sentences", false, "sentence splitting needs NLTK's punkt models, which are not "
                                 "built; pass sentences as a JSON list of strings instead"},
    {"--keep-newlines", false, "belongs to --split-sentences, which is not built"},
    {"--find-optimal-num-workers", false, "not built; workers scale with cores, use --workers N"},
    {"--workers-to-check", true, "belongs to --find-optimal-num-workers, which is not built"},
    {"--performance-dir", true, "belongs to --find-optimal-num-workers, which is not built"},
    {"--max-documents", true, "belongs to --find-optimal-num-workers, which is not built"},
};

// ---- work items
struct KeyOutput {
  std::vector<std::byte> tokens;  // in the output dtype
  std::vector<int32_t> sequence_lengths;
  std::vector<int32_t> sequences_per_document;
  int64_t empty_documents = 0;
};

struct BadLine {
  int64_t line;
  std::string reason;
};

struct Batch {
  uint64_t number = 0;
  size_t file = 0;
  int64_t first_line = 1;
  std::string text;  // whole lines
  std::vector<KeyOutput> outputs;
  std::vector<BadLine> bad_lines;
  int64_t documents = 0, repaired_lines = 0;
  int64_t skipped_bytes = 0;  // of a line over --max-line-bytes, read and dropped
};

const char* json_type(const nlohmann::json& value) {
  if (value.is_number()) return "a number";
  if (value.is_boolean()) return "a boolean";
  if (value.is_null()) return "null";
  if (value.is_object()) return "an object";
  if (value.is_array()) return "a list with a non-string item";
  return value.type_name();
}

// Parses and tokenizes one batch on a worker thread.
class BatchEncoder {
 public:
  BatchEncoder(const PreprocessOptions& options, std::unique_ptr<Tokenizer> tokenizer, DType dtype)
      : options_(options), tokenizer_(std::move(tokenizer)), dtype_(dtype) {}

  void encode(Batch& batch) {
    batch.outputs.assign(options_.json_keys.size(), KeyOutput{});
    int64_t line_number = batch.first_line;
    for (size_t start = 0; start < batch.text.size(); ++line_number) {
      size_t stop = batch.text.find('\n', start);
      if (stop == std::string::npos) stop = batch.text.size();
      const std::string_view line(batch.text.data() + start, stop - start);
      start = stop + 1;
      if (std::all_of(line.begin(), line.end(),
                      [](char c) { return c == ' ' || c == '\t' || c == '\r'; })) {
        continue;
      }
      ++batch.documents;
      std::string_view json = line;
      if (!is_valid_utf8(line)) {
        replace_invalid_utf8(line, repaired_);
        json = repaired_;
        ++batch.repaired_lines;
      }
      if (std::string reason = encode_document(json, batch.outputs); !reason.empty()) {
        batch.bad_lines.push_back({line_number, std::move(reason)});
      }
    }
  }

 private:
  // Appends the document's tokens to each key's output; returns why the line is bad, or "".
  std::string encode_document(std::string_view json, std::vector<KeyOutput>& outputs) {
    nlohmann::json document;
    // Every nlohmann exception is about this line: parse_error for bad syntax, and also
    // out_of_range for a number beyond a double (1e999999), which is valid JSON syntax.
    try {
      document = nlohmann::json::parse(json);
    } catch (const nlohmann::json::exception& error) {
      std::string reason = error.what();
      const size_t colon = reason.find("] ");
      if (colon != std::string::npos) reason = reason.substr(colon + 2);
      return dynamic_cast<const nlohmann::json::parse_error*>(&error) ? "invalid JSON: " + reason
                                                                      : reason;
    }
    if (!document.is_object()) return fmt::format("{} is not a JSON object", document.type_name());
    // Check every key before writing anything, so a bad line leaves no trace in any output.
    values_.clear();
    for (const std::string& key : options_.json_keys) {
      const auto found = document.find(key);
      if (found == document.end()) return fmt::format("no key \"{}\"", key);
      const nlohmann::json& value = *found;
      const bool strings = value.is_string() ||
                           (value.is_array() && std::all_of(value.begin(), value.end(),
                                                            [](const auto& item) {
                                                              return item.is_string();
                                                            }));
      if (!strings) {
        return fmt::format("key \"{}\" is {}, not a string or a list of strings", key,
                           json_type(value));
      }
      values_.push_back(&value);
    }
    // Tokenize into scratch first: a NullTokenizer error is a bad line too.
    try {
      for (size_t k = 0; k < values_.size(); ++k) tokenize_value(*values_[k], k);
    } catch (const common::Error& error) {
      pending_.clear();
      return error.what();
    }
    for (size_t k = 0; k < values_.size(); ++k) commit(pending_[k], outputs[k]);
    pending_.clear();
    return "";
  }

  struct PendingDocument {
    std::vector<int32_t> ids;
    std::vector<int32_t> lengths;
  };

  void tokenize_value(const nlohmann::json& value, size_t key) {
    if (pending_.size() <= key) pending_.resize(key + 1);
    PendingDocument& document = pending_[key];
    document.ids.clear();
    document.lengths.clear();
    std::vector<int32_t>& ids = ids_;
    const auto add_sentence = [&](const std::string& sentence) {
      ids.clear();
      tokenizer_->tokenize(sentence, ids);
      if (ids.empty()) return;
      if (ids.size() > size_t(std::numeric_limits<int32_t>::max())) {
        common::fail("a sequence of {} tokens does not fit the index's int32 lengths", ids.size());
      }
      document.ids.insert(document.ids.end(), ids.begin(), ids.end());
      document.lengths.push_back(static_cast<int32_t>(ids.size()));
    };
    if (value.is_string()) {
      add_sentence(value.get_ref<const std::string&>());
    } else {
      for (const auto& item : value) add_sentence(item.get_ref<const std::string&>());
    }
    if (!document.ids.empty() && options_.append_eod) {
      document.ids.push_back(tokenizer_->eod());
      ++document.lengths.back();
    }
  }

  void commit(const PendingDocument& document, KeyOutput& output) {
    const size_t item = static_cast<size_t>(dtype_size(dtype_));
    const size_t offset = output.tokens.size();
    output.tokens.resize(offset + document.ids.size() * item);
    std::byte* out = output.tokens.data() + offset;
    if (dtype_ == DType::uint16) {
      for (size_t i = 0; i < document.ids.size(); ++i) {
        const auto value = static_cast<uint16_t>(document.ids[i]);
        std::memcpy(out + 2 * i, &value, 2);
      }
    } else {
      std::memcpy(out, document.ids.data(), document.ids.size() * 4);
    }
    output.sequence_lengths.insert(output.sequence_lengths.end(), document.lengths.begin(),
                                   document.lengths.end());
    output.sequences_per_document.push_back(static_cast<int32_t>(document.lengths.size()));
    if (document.lengths.empty()) ++output.empty_documents;
  }

  const PreprocessOptions& options_;
  std::unique_ptr<Tokenizer> tokenizer_;
  DType dtype_;
  std::string repaired_;
  std::vector<const nlohmann::json*> values_;
  std::vector<PendingDocument> pending_;
  std::vector<int32_t> ids_;
};

// ---- the pipeline's shared state
class Pipeline {
 public:
  Pipeline(const PreprocessOptions& options, const Tokenizer& tokenizer, DType dtype)
      : options_(options),
        max_in_flight_(2 * static_cast<int64_t>(options.workers) + 2) {
    for (int i = 0; i < options.workers; ++i) {
      encoders_.push_back(std::make_unique<BatchEncoder>(options, tokenizer.clone(), dtype));
    }
  }

  ~Pipeline() { stop(); }

  void start(std::ostream& out) {
    reader_ = std::thread([this, &out] { guarded([&] { read_inputs(out); }); });
    for (auto& encoder : encoders_) {
      workers_.emplace_back([this, encoder = encoder.get()] { guarded([&] { work(*encoder); }); });
    }
  }

  // The next finished batch in input order, or nullptr at the end; rethrows a thread's error.
  std::unique_ptr<Batch> next() {
    std::unique_lock lock(mutex_);
    writer_wakeup_.wait(lock, [&] {
      return cancelled_ || finished_.count(next_to_write_) > 0 ||
             (reader_done_ && next_to_write_ == batches_read_);
    });
    if (cancelled_) {
      const std::exception_ptr error = error_;
      lock.unlock();
      stop();
      if (error) std::rethrow_exception(error);
      return nullptr;
    }
    if (reader_done_ && next_to_write_ == batches_read_ && finished_.count(next_to_write_) == 0) {
      return nullptr;
    }
    auto batch = std::move(finished_[next_to_write_]);
    finished_.erase(next_to_write_);
    ++next_to_write_;
    return batch;
  }

  // The writer has written a batch: one more may be read.
  void written() {
    std::lock_guard lock(mutex_);
    --in_flight_;
    reader_wakeup_.notify_one();
  }

  void stop() {
    {
      std::lock_guard lock(mutex_);
      cancelled_ = true;
    }
    reader_wakeup_.notify_all();
    work_wakeup_.notify_all();
    writer_wakeup_.notify_all();
    if (reader_.joinable()) reader_.join();
    for (auto& worker : workers_) {
      if (worker.joinable()) worker.join();
    }
  }

  const std::vector<std::string>& files() const { return options_.inputs; }

 private:
  template <typename Body>
  void guarded(Body&& body) {
    try {
      body();
    } catch (...) {
      std::lock_guard lock(mutex_);
      if (!error_) error_ = std::current_exception();
      cancelled_ = true;
      reader_wakeup_.notify_all();
      work_wakeup_.notify_all();
      writer_wakeup_.notify_all();
    }
  }

  // Queues one batch; false when the run was cancelled.
  bool push(std::unique_ptr<Batch> batch) {
    std::unique_lock lock(mutex_);
    reader_wakeup_.wait(lock, [&] { return cancelled_ || in_flight_ < max_in_flight_; });
    if (cancelled_) return false;
    batch->number = batches_read_++;
    ++in_flight_;
    work_.push_back(std::move(batch));
    work_wakeup_.notify_one();
    return true;
  }

  void read_inputs(std::ostream& out) {
    const auto batch_bytes = static_cast<size_t>(std::max<int64_t>(options_.batch_bytes, 1));
    const auto max_line_bytes = static_cast<size_t>(std::max<int64_t>(options_.max_line_bytes, 1));
    std::vector<char> chunk(std::max<size_t>(batch_bytes, 64 << 10));
    for (size_t file = 0; file < options_.inputs.size(); ++file) {
      {
        std::lock_guard lock(mutex_);
        if (cancelled_) return;
      }
      CompressedInput input(options_.inputs[file]);
      out << "Opening " << options_.inputs[file] << std::endl;
      std::string pending;  // bytes read but not yet in a batch
      // Where the last newline of `pending` is (npos: none), found in each read's new bytes
      // only: searching all of `pending` after every read was quadratic in a long line.
      size_t last_newline = std::string::npos;
      int64_t next_line = 1;
      // A line over --max-line-bytes: its bytes are dropped until its newline.
      bool skipping_line = false;
      int64_t skipped_bytes = 0;
      const auto emit = [&](size_t length) {
        auto batch = std::make_unique<Batch>();
        batch->file = file;
        batch->first_line = next_line;
        batch->text.assign(pending, 0, length);
        pending.erase(0, length);
        last_newline = std::string::npos;
        next_line += std::count(batch->text.begin(), batch->text.end(), '\n');
        return push(std::move(batch));
      };
      // The skipped line goes through the pipeline as a batch of its own, so that it is
      // reported in input order with its number, as a bad line of a batch is.
      const auto emit_skipped_line = [&] {
        auto batch = std::make_unique<Batch>();
        batch->file = file;
        batch->first_line = next_line;
        batch->documents = 1;  // a bad line is a document in Megatron's count
        batch->skipped_bytes = skipped_bytes;
        batch->bad_lines.push_back(
            {next_line, fmt::format("the line is longer than --max-line-bytes {} (raise it to "
                                    "read such lines)", max_line_bytes)});
        ++next_line;
        skipping_line = false;
        skipped_bytes = 0;
        return push(std::move(batch));
      };
      while (true) {
        const size_t got = input.read(chunk.data(), chunk.size());
        if (got == 0) break;
        std::string_view fresh(chunk.data(), got);
        if (skipping_line) {
          const size_t end = fresh.find('\n');
          if (end == std::string_view::npos) {
            skipped_bytes += static_cast<int64_t>(got);
            continue;
          }
          skipped_bytes += static_cast<int64_t>(end + 1);
          fresh.remove_prefix(end + 1);
          if (!emit_skipped_line()) return;
        }
        // Each line that ends in (or runs to the end of) the new bytes is measured; the lines
        // that fit are appended in one piece, a line that does not is dropped.
        size_t open_in_pending =  // the line `pending` ends with, unfinished
            last_newline == std::string::npos ? pending.size() : pending.size() - last_newline - 1;
        size_t kept_from = 0;   // the new bytes from here on are not yet in `pending`
        size_t line_begin = 0;  // where the line being measured starts in the new bytes
        while (line_begin < fresh.size()) {
          const size_t newline = fresh.find('\n', line_begin);
          const size_t line_end = newline == std::string_view::npos ? fresh.size() : newline;
          if (open_in_pending + (line_end - line_begin) > max_line_bytes) {
            pending.append(fresh.substr(kept_from, line_begin - kept_from));
            const size_t dropped = open_in_pending;
            pending.resize(pending.size() - dropped);
            // Complete lines before it go first, in their own batch.
            if (!pending.empty() && !emit(pending.size())) return;
            last_newline = std::string::npos;
            skipped_bytes = static_cast<int64_t>(dropped + (line_end - line_begin));
            open_in_pending = 0;
            if (newline == std::string_view::npos) {
              skipping_line = true;
              kept_from = fresh.size();
              break;
            }
            skipped_bytes += 1;  // its newline
            if (!emit_skipped_line()) return;
            kept_from = line_begin = newline + 1;
            continue;
          }
          if (newline == std::string_view::npos) break;
          open_in_pending = 0;
          line_begin = newline + 1;
        }
        if (kept_from < fresh.size()) {
          const std::string_view kept = fresh.substr(kept_from);
          const size_t kept_newline = kept.rfind('\n');
          if (kept_newline != std::string_view::npos) last_newline = pending.size() + kept_newline;
          pending.append(kept);
        }
        if (pending.size() >= batch_bytes && last_newline != std::string::npos &&
            !emit(last_newline + 1)) {
          return;
        }
      }
      if (skipping_line && !emit_skipped_line()) return;
      if (!pending.empty() && !emit(pending.size())) return;
    }
    std::lock_guard lock(mutex_);
    reader_done_ = true;
    work_wakeup_.notify_all();
    writer_wakeup_.notify_all();
  }

  void work(BatchEncoder& encoder) {
    while (true) {
      std::unique_ptr<Batch> batch;
      {
        std::unique_lock lock(mutex_);
        work_wakeup_.wait(lock, [&] { return cancelled_ || !work_.empty() || reader_done_; });
        if (cancelled_ || work_.empty()) return;
        batch = std::move(work_.front());
        work_.pop_front();
      }
      encoder.encode(*batch);
      std::lock_guard lock(mutex_);
      const uint64_t number = batch->number;
      finished_[number] = std::move(batch);
      writer_wakeup_.notify_one();
    }
  }

  const PreprocessOptions& options_;
  const int64_t max_in_flight_;
  std::vector<std::unique_ptr<BatchEncoder>> encoders_;
  std::thread reader_;
  std::vector<std::thread> workers_;

  std::mutex mutex_;
  std::condition_variable reader_wakeup_, work_wakeup_, writer_wakeup_;
  std::deque<std::unique_ptr<Batch>> work_;
  std::map<uint64_t, std::unique_ptr<Batch>> finished_;
  int64_t in_flight_ = 0;
  uint64_t batches_read_ = 0, next_to_write_ = 0;
  bool reader_done_ = false, cancelled_ = false;
  std::exception_ptr error_;
};

void create_parent_directory(const std::string& prefix) {
  const std::filesystem::path parent = std::filesystem::path(prefix).parent_path();
  if (parent.empty()) return;
  std::error_code error;
  std::filesystem::create_directories(parent, error);
  if (error) {
    common::fail("--output-prefix {}: cannot create the directory {}: {}", prefix,
                 parent.string(), error.message());
  }
}

std::string format_rate(double value) { return fmt::format("{:.1f}", value); }

// ---- --merge: tools/merge_datasets.py
std::vector<std::string> merge_inputs(const PreprocessOptions& options) {
  std::vector<std::string> prefixes;
  const auto strip = [](std::string path) {
    for (const char* extension : {".idx", ".bin"}) {
      if (path.ends_with(extension)) path.resize(path.size() - 4);
    }
    return path;
  };
  for (const std::string& input : options.inputs) {
    if (!std::filesystem::is_directory(input)) {
      prefixes.push_back(strip(input));
      continue;
    }
    // A directory: every .bin/.idx pair in it, in sorted order, as merge_datasets.py does.
    std::set<std::string> stems;
    std::set<std::string> seen_bin, seen_idx;
    for (const auto& entry : std::filesystem::directory_iterator(input)) {
      if (!entry.is_regular_file()) continue;
      const std::string path = entry.path().string();
      if (path.ends_with(".bin")) seen_bin.insert(strip(path));
      if (path.ends_with(".idx")) seen_idx.insert(strip(path));
    }
    for (const std::string& stem : seen_bin) {
      if (!seen_idx.contains(stem)) common::fail("--merge: {}.bin has no {}.idx beside it", stem, stem);
      stems.insert(stem);
    }
    for (const std::string& stem : seen_idx) {
      if (!seen_bin.contains(stem)) common::fail("--merge: {}.idx has no {}.bin beside it", stem, stem);
    }
    if (stems.empty()) common::fail("--merge: the directory {} holds no .bin/.idx pairs", input);
    prefixes.insert(prefixes.end(), stems.begin(), stems.end());
  }
  // A previous output in the input directory is not merged into itself.
  std::erase_if(prefixes, [&](const std::string& prefix) {
    return std::filesystem::weakly_canonical(prefix + ".idx") ==
           std::filesystem::weakly_canonical(options.output_prefix + ".idx");
  });
  if (prefixes.empty()) common::fail("--merge: nothing to merge");
  return prefixes;
}

PreprocessSummary merge(const PreprocessOptions& options, std::ostream& out, std::ostream& err) {
  const auto start = Clock::now();
  const std::vector<std::string> prefixes = merge_inputs(options);
  // Every input is opened (and so checked) and its dtype compared before the output exists:
  // merge_datasets.py takes the first dataset's dtype and fails inside add_index on a later one.
  const DType dtype = IndexedDataset(prefixes.front()).dtype();
  for (size_t i = 1; i < prefixes.size(); ++i) {
    const DType other = IndexedDataset(prefixes[i]).dtype();
    if (other != dtype) {
      common::fail("--merge: {}.idx holds {} tokens but {}.idx holds {}; datasets of one dtype "
                   "merge (preprocess them with the same tokenizer: uint16 below 65,500 ids, "
                   "else int32)", prefixes[i], dtype_name(other), prefixes.front(),
                   dtype_name(dtype));
    }
  }
  create_parent_directory(options.output_prefix);
  IndexedDatasetWriter writer(options.output_prefix, dtype);
  for (const std::string& prefix : prefixes) {
    out << "Merging " << prefix << std::endl;
    writer.add_dataset(prefix);
  }
  writer.finalize();
  PreprocessSummary summary;
  summary.seconds = seconds_since(start);
  summary.documents = writer.document_count();
  summary.outputs.push_back({.key = "",
                             .prefix = options.output_prefix,
                             .documents = writer.document_count(),
                             .sequences = writer.sequence_count(),
                             .tokens = writer.token_count(),
                             .empty_documents = 0});
  err << fmt::format("Merged {} datasets: {} documents, {} sequences, {} tokens ({}) → {}.bin, "
                     ".idx in {} s\n", prefixes.size(), writer.document_count(),
                     writer.sequence_count(), writer.token_count(), dtype_name(dtype),
                     options.output_prefix, format_rate(summary.seconds));
  return summary;
}

// Two paths name one file: the same real path, or (both existing) the same inode, which also
// catches hard links.
bool same_file(const std::filesystem::path& a, const std::filesystem::path& b) {
  std::error_code error_a, error_b;
  const auto real_a = std::filesystem::weakly_canonical(a, error_a);
  const auto real_b = std::filesystem::weakly_canonical(b, error_b);
  if (!error_a && !error_b && real_a == real_b) return true;
  std::error_code error;
  return std::filesystem::equivalent(a, b, error) && !error;
}

// The files the run would read and write; an output that is an input would be overwritten.
void refuse_outputs_that_are_inputs(const PreprocessOptions& options) {
  std::vector<std::string> outputs, inputs;
  if (options.merge) {
    outputs = {data_file_path(options.output_prefix), index_file_path(options.output_prefix)};
    for (std::string input : options.inputs) {
      std::error_code error;
      if (std::filesystem::is_directory(input, error)) continue;  // the output in it is skipped
      for (const char* extension : {".idx", ".bin"}) {
        if (input.ends_with(extension)) input.resize(input.size() - 4);
      }
      inputs.push_back(data_file_path(input));
      inputs.push_back(index_file_path(input));
    }
  } else {
    for (const std::string& key : options.json_keys) {
      const std::string prefix = fmt::format("{}_{}_document", options.output_prefix, key);
      outputs.push_back(data_file_path(prefix));
      outputs.push_back(index_file_path(prefix));
    }
    inputs = options.inputs;
  }
  for (const std::string& output : outputs) {
    for (const std::string& input : inputs) {
      if (same_file(output, input)) {
        common::fail("--output-prefix {} would write {}, which is the --input {} (the input would "
                     "be overwritten); choose another --output-prefix", options.output_prefix,
                     output, input);
      }
    }
  }
}

}  // namespace

int available_cores() {
  cpu_set_t cores;
  CPU_ZERO(&cores);
  if (::sched_getaffinity(0, sizeof cores, &cores) == 0) return std::max(1, CPU_COUNT(&cores));
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

std::optional<PreprocessOptions> parse_preprocess_arguments(int argc, const char* const* argv) {
  PreprocessOptions options;
  CLI::App app{"Tokenize JSONL corpora into Megatron .bin/.idx datasets "
               "(Megatron-LM tools/preprocess_data.py flags), or merge datasets", "preprocess_data"};
  app.option_defaults()->always_capture_default()->multi_option_policy(
      CLI::MultiOptionPolicy::TakeLast);
  app.get_formatter()->column_width(40);
  const char* input = "Input data";
  app.add_option("--input", options.inputs,
                 "JSONL files (plain, .gz, .zst, .xz), written in this order into one output; "
                 "with --merge, a directory of .bin/.idx pairs or dataset prefixes")
      ->group(input)->required()->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app.add_option("--json-keys", options.json_keys, "Keys to extract from each JSON line")
      ->group(input)->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  std::string dataset_impl = "mmap";
  app.add_option("--dataset-impl", dataset_impl, "Only mmap (older Megatron's flag)")->group(input);
  std::string lang = "english";
  app.add_option("--lang", lang, "Unused without --split-sentences")->group(input);
  const char* tokenizer = "Tokenizer";
  app.add_option("--tokenizer-type", options.tokenizer.tokenizer_type,
                 "GPT2BPETokenizer, NullTokenizer, SentencePieceTokenizer, "
                 "GPTSentencePieceTokenizer, Llama2Tokenizer or HuggingFaceTokenizer")
      ->group(tokenizer);
  // --vocab: Megatron's README spelling. Its preprocess_data had no other --vocab* flag until
  // mid-2023, so argparse took the prefix for --vocab-file; --vocab-size and --vocab-extra-ids
  // would make it ambiguous here, so it is a name of its own.
  app.add_option("--vocab-file,--vocab", options.tokenizer.vocab_file,
                 "GPT-2 vocab.json (--vocab: older Megatron's abbreviation)")
      ->group(tokenizer);
  app.add_option("--merge-file", options.tokenizer.merge_file, "GPT-2 merges.txt")->group(tokenizer);
  app.add_option("--tokenizer-model", options.tokenizer.tokenizer_model,
                 "SentencePiece model (Llama 2's tokenizer.model), or HuggingFaceTokenizer's "
                 "tokenizer.json directory")->group(tokenizer);
  app.add_option("--vocab-size", options.tokenizer.vocab_size, "NullTokenizer's vocabulary")
      ->group(tokenizer);
  app.add_option("--vocab-extra-ids", options.tokenizer.vocab_extra_ids,
                 "SentencePieceTokenizer's <extra_id_N> tokens (T5 sentinels)")->group(tokenizer);
  app.add_flag("--append-eod", options.append_eod, "Append the eod token to each document")
      ->group(tokenizer);
  const char* output = "Output data";
  app.add_option("--output-prefix", options.output_prefix,
                 "Outputs are <prefix>_<key>_document.bin/.idx (with --merge: <prefix>.bin/.idx)")
      ->group(output)->required();
  const char* runtime = "Runtime";
  app.add_option("--workers", options.workers,
                 "Tokenizer threads (more than the cores this process may use run as many)")
      ->group(runtime);
  int64_t partitions = 1;
  app.add_option("--partitions", partitions, "Accepted; the input is streamed, never split")
      ->group(runtime);
  bool keep_sequential_samples = false;
  app.add_flag("--keep-sequential-samples", keep_sequential_samples,
               "Accepted; input order is always kept")->group(runtime);
  app.add_option("--log-interval", options.log_interval, "Documents between progress lines")
      ->group(runtime);
  app.add_flag("--strict", options.strict, "Stop at the first bad line instead of skipping it")
      ->group(runtime);
  app.add_option("--max-line-bytes", options.max_line_bytes,
                 "Longest input line read (ours); a longer line is a bad line, skipped unread")
      ->group(runtime);
  app.add_flag("--merge", options.merge,
               "Concatenate the datasets of --input into <prefix>.bin/.idx (merge_datasets.py)")
      ->group(runtime);
  app.add_flag("--remove-input", options.remove_inputs,
               "Delete the input files once the datasets are written (not with --merge)")
      ->group(runtime);
  common::apply_flag_rules(app, kPreprocessFlagRules);
  const common::RefusedFlags refused(app, kRefusedFlags);
  if (!common::parse_command_line(app, argc, argv, "preprocess_data", refused, "is not supported")) {
    return std::nullopt;
  }
  if (dataset_impl != "mmap") {
    common::fail("--dataset-impl {} is not supported: only mmap (Megatron's MMapIndexedDataset) "
                 "is written", dataset_impl);
  }
  // An empty prefix would write `_text_document.bin/.idx` into the current directory.
  if (options.output_prefix.empty()) {
    common::fail("--output-prefix is empty: give the path prefix of the datasets to write (e.g. "
                 "data/corpus, which writes data/corpus_text_document.bin and .idx)");
  }
  if (!options.merge) {
    if (options.tokenizer.tokenizer_type.empty()) {
      common::fail("--tokenizer-type is required (GPT2BPETokenizer, NullTokenizer, "
                   "SentencePieceTokenizer, GPTSentencePieceTokenizer, Llama2Tokenizer or "
                   "HuggingFaceTokenizer)");
    }
    check_tokenizer_flags(options.tokenizer);  // flag errors before any file is read
    if (options.json_keys.empty()) common::fail("--json-keys needs at least one key");
    std::set<std::string> keys;
    for (const std::string& key : options.json_keys) {
      if (!keys.insert(key).second) common::fail("--json-keys lists \"{}\" twice", key);
    }
  }
  if (options.merge && options.remove_inputs) {
    common::fail(
        "--remove-input deletes JSONL inputs after tokenizing them; it does not apply to "
        "--merge, whose inputs are datasets");
  }
  refuse_outputs_that_are_inputs(options);
  return options;
}

PreprocessSummary preprocess_data(const PreprocessOptions& options, std::ostream& out,
                                  std::ostream& err) {
  if (options.inputs.empty()) common::fail("--input: no input files");
  if (options.merge) return merge(options, out, err);
  if (options.workers < 1 || options.workers > kMaxWorkers) {
    common::fail("--workers must lie in [1, {}], got {}", kMaxWorkers, options.workers);
  }
  // Workers beyond the cores this process may run on cannot tokenize faster; they only add
  // memory. Megatron's scripts often pass a node's core count to a task that has fewer, so
  // this is said and adjusted, not refused. The output does not depend on the count.
  PreprocessOptions run_options = options;
  if (const int cores = available_cores(); options.workers > cores) {
    err << fmt::format("preprocess_data: --workers {}: this process may run on {} cores; using "
                       "{} workers\n", options.workers, cores, cores);
    run_options.workers = cores;
  }

  const auto startup_start = Clock::now();
  for (const std::string& input : options.inputs) {
    if (std::filesystem::is_directory(input)) {
      common::fail("--input {} is a directory; give the JSONL files (a directory of datasets is "
                   "for --merge)", input);
    }
  }
  const std::unique_ptr<Tokenizer> tokenizer = build_tokenizer(options.tokenizer);
  const DType dtype = optimal_dtype(tokenizer->vocab_size());
  create_parent_directory(options.output_prefix);
  std::vector<std::unique_ptr<IndexedDatasetWriter>> writers;
  PreprocessSummary summary;
  for (const std::string& key : options.json_keys) {
    const std::string prefix = fmt::format("{}_{}_document", options.output_prefix, key);
    writers.push_back(std::make_unique<IndexedDatasetWriter>(prefix, dtype));
    summary.outputs.push_back({.key = key, .prefix = prefix, .documents = 0, .sequences = 0,
                               .tokens = 0, .empty_documents = 0});
  }

  Pipeline pipeline(run_options, *tokenizer, dtype);
  out << "Time to startup: " << seconds_since(startup_start) << std::endl;
  const auto start = Clock::now();
  pipeline.start(out);
  constexpr int64_t kBadLinesShown = 20;
  int64_t next_report = options.log_interval;
  while (std::unique_ptr<Batch> batch = pipeline.next()) {
    for (const BadLine& bad : batch->bad_lines) {
      const std::string& file = options.inputs[batch->file];
      if (options.strict) {
        common::fail("{}:{}: {} (--strict stops at the first bad line)", file, bad.line,
                     bad.reason);
      }
      if (summary.bad_lines < kBadLinesShown) {
        err << fmt::format("{}:{}: skipped: {}\n", file, bad.line, bad.reason);
      }
      ++summary.bad_lines;
    }
    for (size_t k = 0; k < writers.size(); ++k) {
      const KeyOutput& output = batch->outputs[k];
      writers[k]->add_documents(output.tokens, output.sequence_lengths,
                                output.sequences_per_document);
      summary.outputs[k].empty_documents += output.empty_documents;
    }
    summary.documents += batch->documents;
    summary.repaired_lines += batch->repaired_lines;
    summary.input_bytes += static_cast<int64_t>(batch->text.size()) + batch->skipped_bytes;
    pipeline.written();
    while (summary.documents >= next_report) {
      const double elapsed = std::max(seconds_since(start), 1e-9);
      err << fmt::format("Processed {} documents ({} docs/s, {} MB/s).\n", next_report,
                         format_rate(static_cast<double>(next_report) / elapsed),
                         format_rate(static_cast<double>(summary.input_bytes) / elapsed / 1048576.0));
      err.flush();
      next_report += options.log_interval;
    }
  }
  for (size_t k = 0; k < writers.size(); ++k) {
    writers[k]->finalize();
    summary.outputs[k].documents = writers[k]->document_count();
    summary.outputs[k].sequences = writers[k]->sequence_count();
    summary.outputs[k].tokens = writers[k]->token_count();
  }
  summary.seconds = seconds_since(start);

  const double elapsed = std::max(summary.seconds, 1e-9);
  struct rusage usage {};
  ::getrusage(RUSAGE_SELF, &usage);
  summary.peak_rss_bytes = static_cast<int64_t>(usage.ru_maxrss) * 1024;
  err << fmt::format("Done: {} documents, {} MB in {} s ({} docs/s, {} MB/s), peak memory {} MB.\n",
                     summary.documents,
                     format_rate(static_cast<double>(summary.input_bytes) / 1048576.0),
                     format_rate(summary.seconds),
                     format_rate(static_cast<double>(summary.documents) / elapsed),
                     format_rate(static_cast<double>(summary.input_bytes) / elapsed / 1048576.0),
                     format_rate(static_cast<double>(summary.peak_rss_bytes) / 1048576.0));
  if (summary.bad_lines > 0) {
    err << fmt::format("Skipped {} bad line{}{}.\n", summary.bad_lines,
                       summary.bad_lines == 1 ? "" : "s",
                       summary.bad_lines > kBadLinesShown
                           ? fmt::format(" (the first {} are listed above)", kBadLinesShown)
                           : "");
  }
  if (summary.repaired_lines > 0) {
    err << fmt::format("{} line{} had invalid UTF-8, replaced by U+FFFD.\n",
                       summary.repaired_lines, summary.repaired_lines == 1 ? "" : "s");
  }
  for (const PreprocessOutput& output : summary.outputs) {
    err << fmt::format("{}: {} documents ({} empty), {} sequences, {} tokens ({}) → {}.bin, .idx\n",
                       output.key, output.documents, output.empty_documents, output.sequences,
                       output.tokens, dtype_name(dtype), output.prefix);
  }
  return summary;
}

}  // namespace backend
