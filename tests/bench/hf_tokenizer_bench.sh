#!/usr/bin/env bash
# Benchmark: single-thread HuggingFaceTokenizer speed (MB/s) with Llama 3's tokenizer.json
# (tests/data/llama3/tokenizer.json.xz) against llama3-tokenizer-js in node, in one run on the
# same text: the copyright files of the Debian packages on this machine, concatenated and cut to
# the requested size, each line one document (as tokenizer_bench.sh). Both encode each line as
# Hugging Face's tokenizer(text).input_ids does (<|begin_of_text|> first): ours through the
# tokenizer_bench target (--hf), the reference with encode(line, {bos: true, eos: false}); for
# each, one cold pass then the best of PASSES warm passes (the reference keeps no cache across
# calls, so its passes differ only by the JIT's warm-up). Load time is excluded. The two must
# give the same number of tokens. Prints markdown tables for docs/benchmarks.md.
# Usage: tests/bench/hf_tokenizer_bench.sh BUILD_DIR NODE_MODULES_DIR [megabytes] [passes]
#   NODE_MODULES_DIR holds llama3-tokenizer-js@1.2.0 (npm install it in a scratch directory).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:?usage: hf_tokenizer_bench.sh BUILD_DIR NODE_MODULES_DIR [megabytes] [passes]}
modules=$(cd "${2:?usage: hf_tokenizer_bench.sh BUILD_DIR NODE_MODULES_DIR [megabytes] [passes]}" && pwd)
megabytes=${3:-8}
passes=${4:-3}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

cmake --build "$build" --target tokenizer_bench >/dev/null
{ find /usr/share/doc -name copyright -type f -print0 | sort -z | xargs -0 cat 2>/dev/null || true; } |
  head -c "$((megabytes * 1000 * 1000))" > "$out/corpus.txt"
mkdir "$out/llama3"
xz -dc "$root/tests/data/llama3/tokenizer.json.xz" > "$out/llama3/tokenizer.json"
cp "$root/tests/data/llama3/tokenizer_config.json" "$out/llama3/"

echo "ours (HuggingFaceTokenizer, Llama 3):"
"$build/bin/tokenizer_bench" --hf "$out/llama3" "$passes" "$out/corpus.txt"

echo
echo "reference (llama3-tokenizer-js in node $(node --version)):"
node --input-type=module - "$modules" "$out/corpus.txt" "$passes" <<'JS'
import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";
const [modules, corpus, passesText] = process.argv.slice(2);
const entry = path.join(modules, "llama3-tokenizer-js", "bundle", "llama3-tokenizer-with-baked-data.js");
const { default: tokenizer } = await import(pathToFileURL(entry).href);
// Lines as tokenizer_bench reads them: each with its '\n', decoded as UTF-8 with replacement.
const bytes = fs.readFileSync(corpus);
const lines = [];
let start = 0;
for (let i = 0; i < bytes.length; ++i) {
  if (bytes[i] === 10) { lines.push(bytes.subarray(start, i + 1).toString("utf8")); start = i + 1; }
}
if (start < bytes.length) lines.push(bytes.subarray(start).toString("utf8") + "\n");
const megabytes = bytes.length / 1e6;
const passes = Math.max(1, Number(passesText));
let cold = 0, warm = Infinity, tokens = 0;
for (let pass = 0; pass <= passes; ++pass) {
  const begin = process.hrtime.bigint();
  tokens = 0;
  for (const line of lines) tokens += tokenizer.encode(line, { bos: true, eos: false }).length;
  const seconds = Number(process.hrtime.bigint() - begin) / 1e9;
  if (pass === 0) cold = seconds; else warm = Math.min(warm, seconds);
}
console.log("| input MB | documents | tokens | bytes/token | cold MB/s | warm MB/s |");
console.log("|---|---|---|---|---|---|");
console.log(`| ${megabytes.toFixed(1)} | ${lines.length} | ${tokens} | ${(bytes.length / tokens).toFixed(2)} | ${(megabytes / cold).toFixed(1)} | ${(megabytes / warm).toFixed(1)} |`);
JS
