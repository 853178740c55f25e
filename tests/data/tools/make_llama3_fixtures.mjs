#!/usr/bin/env node
// Generates the Llama 3 test data of HuggingFaceTokenizer (tests/data/llama3/): run once by
// hand; the output is committed, this script and its references are not needed to build or
// test.
//  1. tokenizer.json.xz: Llama 3.1's tokenizer.json rebuilt from the vocabulary and merges that
//     llama3-tokenizer-js@1.2.0 carries (converted by its author from Meta's tokenizer.json;
//     row order = id), in Hugging Face's format with the structure Meta's file has: the
//     256 special tokens 128000..128255 as added_tokens (Llama 3.1's names, the package's list),
//     no normalizer, pre_tokenizer Sequence[Split{Llama 3's regex, Isolated},
//     ByteLevel{use_regex: false}], post_processor Sequence[ByteLevel, TemplateProcessing
//     putting <|begin_of_text|> before the text], decoder ByteLevel, model BPE with
//     ignore_merges true and merges in the [a, b] pair form. Written in a fixed key order
//     (the output is deterministic), then `xz -9e`.
//  2. tokenizer_config.json: bos/eos tokens as Llama 3.1 base's (eos <|end_of_text|>).
//  3. llama3_tokenizer_fixtures.jsonl: the texts of tests/data/gpt2_tokenizer_fixtures.jsonl
//     (the decoded text where the entry is bytes) plus Llama-3-specific ones, each with the ids
//     Hugging Face's encode(text) gives: <|begin_of_text|> first, special tokens in the text
//     split out. Two encoders must agree: llama3-tokenizer-js (encode with bos true, eos false)
//     and tools/hf_bpe_reference_encoder.py (Python `regex` module). Texts holding U+0085,
//     U+FEFF or U+017F, where JavaScript's regex differs from Oniguruma's (HF) and Python's,
//     come from the Python encoder alone, marked {"python_only": true}.
// Usage: node make_llama3_fixtures.mjs NODE_MODULES_DIR
//   NODE_MODULES_DIR holds llama3-tokenizer-js@1.2.0; python3 with `regex` and xz on PATH.
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const dataDir = path.resolve(here, "..");
const outDir = path.join(dataDir, "llama3");
const modulesDir = process.argv[2];
if (!modulesDir) {
  console.error("usage: make_llama3_fixtures.mjs NODE_MODULES_DIR");
  process.exit(2);
}
const packageEntry = path.join(path.resolve(modulesDir), "llama3-tokenizer-js", "bundle",
                               "llama3-tokenizer-with-baked-data.js");
const { default: llama3 } = await import(pathToFileURL(packageEntry).href);

// ---------------------------------------------------------------- tokenizer.json
const kRegex = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const kBaseTokens = 128000;
const vocabById = llama3.vocabById;
if (vocabById.length !== 128256) throw new Error(`expected 128256 tokens, got ${vocabById.length}`);
const vocab = {};
for (let id = 0; id < kBaseTokens; ++id) vocab[vocabById[id]] = id;
if (Object.keys(vocab).length !== kBaseTokens) throw new Error("duplicate vocabulary entries");
const merges = [];
for (const key of llama3.merges.keys()) {  // insertion order = rank
  const parts = key.split(" ");
  if (parts.length !== 2) throw new Error(`merge ${key} is not two tokens`);
  merges.push(parts);
}
const addedTokens = [];
for (let id = kBaseTokens; id < vocabById.length; ++id) {
  addedTokens.push({ id, content: vocabById[id], single_word: false, lstrip: false,
                     rstrip: false, normalized: false, special: true });
}
const bos = "<|begin_of_text|>";
const tokenizerJson = {
  version: "1.0",
  truncation: null,
  padding: null,
  added_tokens: addedTokens,
  normalizer: null,
  pre_tokenizer: {
    type: "Sequence",
    pretokenizers: [
      { type: "Split", pattern: { Regex: kRegex }, behavior: "Isolated", invert: false },
      { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: false },
    ],
  },
  post_processor: {
    type: "Sequence",
    processors: [
      { type: "ByteLevel", add_prefix_space: true, trim_offsets: false, use_regex: true },
      {
        type: "TemplateProcessing",
        single: [{ SpecialToken: { id: bos, type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }],
        pair: [{ SpecialToken: { id: bos, type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } },
               { SpecialToken: { id: bos, type_id: 1 } }, { Sequence: { id: "B", type_id: 1 } }],
        special_tokens: { [bos]: { id: bos, ids: [128000], tokens: [bos] } },
      },
    ],
  },
  decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
  model: {
    type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: null,
    end_of_word_suffix: null, fuse_unk: false, byte_fallback: false, ignore_merges: true,
    vocab, merges,
  },
};
fs.mkdirSync(outDir, { recursive: true });
const scratch = fs.mkdtempSync(path.join(os.tmpdir(), "llama3-fixtures-"));
const jsonPath = path.join(scratch, "tokenizer.json");
fs.writeFileSync(jsonPath, JSON.stringify(tokenizerJson, null, 2) + "\n");
execFileSync("xz", ["-9e", "-k", "-f", "-T1", jsonPath]);
fs.copyFileSync(jsonPath + ".xz", path.join(outDir, "tokenizer.json.xz"));
fs.writeFileSync(path.join(outDir, "tokenizer_config.json"), JSON.stringify({
  bos_token: bos, eos_token: "<|end_of_text|>", clean_up_tokenization_spaces: true,
  model_input_names: ["input_ids", "attention_mask"], model_max_length: 131072,
  tokenizer_class: "PreTrainedTokenizerFast",
}, null, 2) + "\n");

// ---------------------------------------------------------------- the corpus
const texts = [];
for (const line of fs.readFileSync(path.join(dataDir, "gpt2_tokenizer_fixtures.jsonl"), "utf8")
       .split("\n")) {
  if (!line) continue;
  const entry = JSON.parse(line);
  texts.push(entry.text ?? Buffer.from(entry.decoded_hex, "hex").toString("utf8"));
}
texts.push(
  "<|begin_of_text|>Hello<|eot_id|>",
  "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n4<|eot_id|>",
  "<|reserved_special_token_247|> is a token, <|reserved_special_token_248|> is not",
  "<|eot_id <|eot_id|| <<|eot_id|>> |><|python_tag|><|eom_id|><|finetune_right_pad_id|>",
  "<|end_of_text|><|end_of_text|>",
  "digits 1 12 123 1234 12345 123456 1234567 ١٢٣٤ 12.345,678",
  "case: 'S 'T 'RE 'Ve 'M 'LL 'D 'ſ 'S ſ x'ſt",
  "newlines\r\n\r\n  \n\t\nend \n",
  "punct!!!\n\n\nnext ?!\r\nline",
  "  \u00a0 \u3000 \t\u000b words",
  "\t\tindent\n    code();\n",
);

// ---------------------------------------------------------------- encode with both
const pythonOutput = JSON.parse(execFileSync("python3", [
  path.join(here, "hf_bpe_reference_encoder.py"), jsonPath,
], { input: JSON.stringify(texts), maxBuffer: 1 << 30 }).toString());
const isPythonOnly = (text) => /[\u0085\ufeff\u017f]/.test(text);
const sameIds = (a, b) => a.length === b.length && a.every((x, i) => x === b[i]);
const lines = [];
let pythonOnlyCount = 0;
texts.forEach((text, index) => {
  const python = pythonOutput[index];
  const record = { text, ids: python };
  if (isPythonOnly(text)) {
    record.python_only = true;
    ++pythonOnlyCount;
  } else {
    const js = llama3.encode(text, { bos: true, eos: false });
    if (!sameIds(js, python)) {
      console.error(`llama3-tokenizer-js and the Python reference disagree on ${JSON.stringify(text).slice(0, 200)}:\n  js ${js}\n  py ${python}`);
      process.exit(1);
    }
  }
  lines.push(JSON.stringify(record));
});
fs.writeFileSync(path.join(outDir, "llama3_tokenizer_fixtures.jsonl"), lines.join("\n") + "\n");
fs.rmSync(scratch, { recursive: true });
console.log(`${lines.length} fixtures (${pythonOnlyCount} Python-only)`);
