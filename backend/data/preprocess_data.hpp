// preprocess_data: Megatron's tools/preprocess_data.py (JSONL → tokenized .bin/.idx) and, with
// --merge, tools/merge_datasets.py, native and multi-threaded.
//
// Per input line (one JSON object = one document), for each --json-keys key: the value is a
// string (one sequence) or a list of strings (one sequence per string, Megatron's sentence
// lists); each is tokenized, sequences with no tokens are dropped, and with --append-eod the
// eod id is appended to a document that has tokens and counted in its last sequence's length
// (current Megatron's Encoder.encode; Megatron 23.06 left it out of the length). A document
// with no tokens is still recorded, as zero sequences. Output per key:
// {output_prefix}_{key}_document.{bin,idx} (indexed_dataset.hpp), dtype uint16 below 65,500
// ids, else int32. Every key is finalized (Megatron's script finalizes only the last one).
//
// Where Megatron stops with a traceback, this counts and goes on: a line that is not JSON (a
// number beyond a double's range included) or not a JSON object, lacks a key, or has a value that is not a string or a list of strings (or text the
// NullTokenizer cannot read) is skipped in every output and reported with its file and line;
// --strict makes the first one fatal. Invalid UTF-8 in a line is replaced (U+FFFD per maximal
// ill-formed subsequence, Python's errors="replace") before parsing, and counted. Blank lines
// are ignored. Inputs may be plain, .gz, .zst or .xz (compressed_input.hpp), several at once,
// written in the order given into one output.
//
// Pipeline: a reader thread cuts the (decompressed) input into batches of whole lines, --workers
// threads parse and tokenize batches (each with its own tokenizer clone and word cache), and the
// calling thread writes finished batches in input order. At most 2 × workers + 2 batches are in
// flight, and the writer streams its index (indexed_dataset.hpp), so memory is bounded by the
// batch size whatever the corpus size, and by --max-line-bytes for a single line longer than a
// batch: a line beyond it is reported and skipped like a line that is not JSON, read through
// without being kept. The reader looks for newlines only in the bytes it has just read, so a
// long line costs linear time however small the reads (a pipe gives 64 KiB at a time).
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "backend/data/tokenizer.hpp"

namespace backend {

struct PreprocessOptions {
  std::vector<std::string> inputs;  // --input: JSONL files; with --merge, a directory or prefixes
  std::string output_prefix;        // --output-prefix
  std::vector<std::string> json_keys{"text"};
  TokenizerOptions tokenizer;
  bool append_eod = false;
  int workers = 1;
  int64_t log_interval = 1000;
  bool strict = false;
  bool merge = false;
  // --remove-input (ours): the tool deletes the --input files once the datasets are written
  // (NeMo's Pile preprocess step with rm_extracted: True); refused with --merge.
  bool remove_inputs = false;
  int64_t batch_bytes = int64_t(1) << 20;  // input bytes per work item (a tuning knob for tests)
  // --max-line-bytes (ours): a longer line is a bad line, skipped (its bytes are read and
  // dropped, never held), so that one enormous line cannot take the machine's memory.
  int64_t max_line_bytes = kDefaultMaxLineBytes;
  static constexpr int64_t kDefaultMaxLineBytes = int64_t(64) << 20;
};

struct PreprocessOutput {
  std::string key, prefix;
  int64_t documents = 0, sequences = 0, tokens = 0, empty_documents = 0;
};

struct PreprocessSummary {
  int64_t documents = 0;  // non-blank input lines, bad ones included (Megatron's count)
  int64_t bad_lines = 0, repaired_lines = 0, input_bytes = 0;
  int64_t peak_rss_bytes = 0;  // the process's peak resident memory (getrusage)
  double seconds = 0;
  std::vector<PreprocessOutput> outputs;
};

// Parses and validates Megatron's preprocess_data.py flags; nullopt after --help. Free of side
// effects (nothing is created or opened for writing), so it can be fuzzed. Numeric flags are
// checked on their text with their ranges (a table of common/flag_rules.hpp;
// --workers in [1, kMaxWorkers]);
// an output file that is one of the inputs (same real path, or the same
// file through a link) is refused, since it would be overwritten.
std::optional<PreprocessOptions> parse_preprocess_arguments(int argc, const char* const* argv);

// The cores this process may run on (its CPU affinity, which Slurm's --cpus-per-task sets),
// the most workers that can help: each worker is a thread with a tokenizer, its word cache and
// batches in flight (a few MB). preprocess_data runs min(--workers, available_cores()) and says
// so when it runs fewer than asked.
int available_cores();

// The most --workers accepted: far above any core count, and a bound on the memory that
// workers take (--workers 100000 used to start threads until the kernel killed the process).
inline constexpr int kMaxWorkers = 1024;

// Runs the conversion (or the merge with options.merge). Megatron's lines "Opening <file>"
// and "Time to startup: <s>" go to `out`; the progress lines
// "Processed <n> documents (<r> docs/s, <m> MB/s)." every --log-interval documents, bad-line
// reports and the final summary go to `err`.
PreprocessSummary preprocess_data(const PreprocessOptions& options, std::ostream& out,
                                  std::ostream& err);

}  // namespace backend
