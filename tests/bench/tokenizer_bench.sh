#!/usr/bin/env bash
# Benchmark: single-thread tokenization speed (MB/s) on a few MB of real English text with
# names and symbols: the copyright files of the Debian packages on this machine, concatenated
# and cut to the requested size, each line one document. Builds the tokenizer_bench target
# first. Prints markdown tables for docs/benchmarks.md:
#   1. GPT-2 BPE (ours), then OpenAI's encoder in Python beside it when python3 has `regex`;
#   2. SentencePiece: our GPTSentencePieceTokenizer and, in the same run, Debian's
#      python3-sentencepiece (the library Megatron's SentencePiece tokenizers call), both with
#      the same model (default tests/data/sentencepiece_bpe.model) on the same documents, ids
#      out, one thread each; the ids of the two are compared through a checksum.
# Usage: tests/bench/tokenizer_bench.sh [build-dir] [megabytes] [passes] [sentencepiece-model]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
megabytes=${2:-8}
passes=${3:-3}
sentencepiece_model=${4:-$root/tests/data/sentencepiece_bpe.model}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

cmake --build "$build" --target tokenizer_bench >/dev/null
# head closes the pipe once it has enough: cat's SIGPIPE is expected
{ find /usr/share/doc -name copyright -type f -print0 | sort -z | xargs -0 cat 2>/dev/null || true; } |
  head -c "$((megabytes * 1000 * 1000))" > "$out/corpus.txt"
"$build/bin/tokenizer_bench" "$root/tests/data/gpt2-vocab.json" "$root/tests/data/gpt2-merges.txt" \
  "$passes" "$out/corpus.txt"

# Side by side, when a python3 with the `regex` module is on PATH: OpenAI's encoder algorithm
# in Python (tests/data/tools/gpt2_reference_encoder.py; the same algorithm as Megatron's
# GPT2BPETokenizer), on the first 2 MB of the same corpus, one thread, its word cache warm
# from the start of the run as in a long preprocessing job. Load time is excluded.
if python3 -c "import regex" 2>/dev/null; then
  head -c 2000000 "$out/corpus.txt" |
    python3 -c "import json, sys; json.dump(sys.stdin.read().split('\n'), sys.stdout)" > "$out/lines.json"
  python3 - "$root" "$out/lines.json" <<'PY'
import importlib.util, json, sys, time
root, lines_file = sys.argv[1], sys.argv[2]
spec = importlib.util.spec_from_file_location("reference", root + "/tests/data/tools/gpt2_reference_encoder.py")
reference = importlib.util.module_from_spec(spec)
spec.loader.exec_module(reference)
encoder = reference.Gpt2Reference(root + "/tests/data/gpt2-vocab.json", root + "/tests/data/gpt2-merges.txt")
lines = json.load(open(lines_file))
megabytes = sum(len(line.encode("utf-8")) + 1 for line in lines) / 1e6
start = time.perf_counter()
tokens = sum(len(encoder.encode(line)[1]) for line in lines)
seconds = time.perf_counter() - start
print(f"\nreference (OpenAI's encoder in Python, regex module): {megabytes:.1f} MB, {tokens} tokens, "
      f"{megabytes / seconds:.2f} MB/s")
PY
else
  echo "(no python3 with the regex module: the Python reference column is skipped)"
fi

# SentencePiece, ours and the reference side by side on the same documents (each line with its
# newline, invalid UTF-8 replaced as Python's bytes.decode("utf-8", "replace") does, which is
# what ours does first), the best of the same number of passes each.
echo
echo "SentencePiece, one thread, model $(basename "$sentencepiece_model"):"
echo
echo "| tokenizer | input MB | documents | tokens | MB/s |"
echo "|---|---|---|---|---|"
"$build/bin/tokenizer_bench" --sentencepiece "$sentencepiece_model" "$passes" "$out/corpus.txt" > "$out/ours.txt"
grep '^|' "$out/ours.txt"
reference_python=
for candidate in /usr/bin/python3 python3; do
  if "$candidate" -c "import sentencepiece" 2>/dev/null; then reference_python=$candidate; break; fi
done
if [[ -n $reference_python ]]; then
  "$reference_python" - "$sentencepiece_model" "$passes" "$out/corpus.txt" > "$out/reference.txt" <<'PY'
import sys, time
import sentencepiece
model, passes, corpus = sys.argv[1], int(sys.argv[2]), sys.argv[3]
data = open(corpus, "rb").read()
lines = data.split(b"\n")
if lines and lines[-1] == b"":
    lines.pop()
documents = [(line + b"\n").decode("utf-8", "replace") for line in lines]
processor = sentencepiece.SentencePieceProcessor(model_file=model)
best = float("inf")
for _ in range(passes):
    checksum = position = 0
    start = time.perf_counter()
    for document in documents:
        for token in processor.encode_as_ids(document):
            position += 1
            checksum += position * token
    best = min(best, time.perf_counter() - start)
megabytes = sum(len(line) + 1 for line in lines) / 1e6
print(f"| reference: python3-sentencepiece {sentencepiece.__version__} encode_as_ids, best of {passes} "
      f"| {megabytes:.1f} | {len(documents)} | {position} | {megabytes / best:.2f} |")
print(f"checksum {checksum % 2**64} tokens {position}")
PY
  grep '^|' "$out/reference.txt"
  if [[ "$(grep '^checksum' "$out/ours.txt")" == "$(grep '^checksum' "$out/reference.txt")" ]]; then
    echo
    echo "ids: identical ($(grep '^checksum' "$out/ours.txt"))"
  else
    echo
    echo "ids: DIFFER (ours: $(grep '^checksum' "$out/ours.txt"); reference: $(grep '^checksum' "$out/reference.txt"))"
    exit 1
  fi
else
  echo
  echo "(no python3 with the sentencepiece module: install python3-sentencepiece for the reference row)"
fi
