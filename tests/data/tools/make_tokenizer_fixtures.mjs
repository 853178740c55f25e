#!/usr/bin/env node
// Generates tests/data/gpt2_tokenizer_fixtures.jsonl, the golden token ids our GPT-2 BPE
// tokenizer must reproduce. Run once by hand; the output is committed, this script and its
// references are not needed to build or test. Three independent encoders must agree:
//   js-tiktoken 1.0.21 (the `gpt2` ranks; tiktoken's merge-lowest-pair-first loop),
//   gpt-3-encoder 1.1.4 (a port of OpenAI's gpt-2 encoder.py; it ships encoder.json/vocab.bpe),
//   gpt2_reference_encoder.py (ours: OpenAI's algorithm over Python's `regex` module).
// The two JavaScript ones split text with JS regular expressions, whose \s differs from
// Python's, which OpenAI's reference uses: JS counts U+FEFF as space and not U+0085 (NEL);
// Python (`regex`, Unicode White_Space) the other way round. Text containing either comes from
// the Python encoder alone and is marked {"python_only": true}. Everything else must give the
// same ids from all three, or the script fails (gpt-3-encoder alone disagreeing is reported as
// its bug and the entry kept with the two agreeing references).
//
// Each output line is {"text": "...", "ids": [...]} or, for bytes that are not valid UTF-8,
// {"bytes_hex": "...", "decoded_hex": "...", "ids": [...]}, where decoded_hex is what the
// WHATWG decoder (TextDecoder, fatal: false) makes of the bytes: each maximal ill-formed
// subsequence becomes U+FFFD, as Python's bytes.decode("utf-8", "replace") does (checked).
//
// Usage: node make_tokenizer_fixtures.mjs NODE_MODULES_DIR [OUTPUT]
//   NODE_MODULES_DIR holds js-tiktoken@1.0.21 and gpt-3-encoder@1.1.4 (npm install them in a
//   scratch directory); python3 with the `regex` module must be on PATH.
import { createRequire } from "node:module";
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const dataDir = path.resolve(here, "..");
const modulesDir = process.argv[2];
const outputPath = process.argv[3] ?? path.join(dataDir, "gpt2_tokenizer_fixtures.jsonl");
if (!modulesDir) {
  console.error("usage: make_tokenizer_fixtures.mjs NODE_MODULES_DIR [OUTPUT]");
  process.exit(2);
}
const require = createRequire(path.join(path.resolve(modulesDir), "noop.js"));
const { getEncoding } = require("js-tiktoken");
const gpt3Encoder = require("gpt-3-encoder");
const tiktoken = getEncoding("gpt2");

const utf8Decoder = new TextDecoder("utf-8", { fatal: false, ignoreBOM: true });
const strictDecoder = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });
const utf8Encoder = new TextEncoder();
const hex = (bytes) => Buffer.from(bytes).toString("hex");

// ---------------------------------------------------------------- the corpus
// Entries are {text} or {bytes}; `label` only helps reading failures.
const corpus = [];
const addText = (text, label = "") => corpus.push({ text, label });
const addBytes = (bytes, label = "") => {
  const buffer = Buffer.from(bytes);
  let valid = true;
  try { strictDecoder.decode(buffer); } catch { valid = false; }
  if (valid) addText(buffer.toString("utf8"), label);
  else corpus.push({ bytes: buffer, label });
};

// Hand-written text: each line of these arrays is one fixture.
const handWritten = [
  "",
  "Hello world",
  "Hello world!",
  " Hello world ",
  "The quick brown fox jumps over the lazy dog.",
  "GPT-2's tokenizer can't, won't, shouldn't've; they'd we'll I'm you're we've.",
  "Odd case: IT'S, HE'LL, THEY'RE, WE'VE, I'M, SHE'D, DON'T; It'S, he'Ll, they'Re, we'vE, 'S 'T 'M 'D 'LL 'RE 'VE.",
  "''s '''t ' s 's's ''' '",
  "rock 'n' roll, 'tis, y'all, o'clock, ma'am",
  "'s",
  "'",
  "x'",
  "it’s a curly apostrophe, not ASCII",
  "  leading spaces",
  "trailing spaces   ",
  "trailing newline\n",
  "trailing mixed \t \n",
  "\n\n\nthree newlines first",
  "a\n\nb\n\n\nc\n\n\n\n",
  "tabs\tinside\t\twords\t\t\t",
  "crlf line\r\nnext line\r\n\r\n",
  "spaces before newline   \nnext",
  "          ten spaces then text",
  "mixed \t\n \t\n  runs\t \n\t  end",
  " \n \n \n ",
  "\t",
  " ",
  "   ",
  "\u000b\u000cvertical tab and form feed\u000b",
  "no-break\u00a0space and\u00a0\u00a0two",
  "ideographic\u3000space\u3000\u3000here",
  "em\u2003space, thin\u2009space, hair\u200aspace",
  "line\u2028separator and paragraph\u2029separator",
  "zero\u200bwidth\u200bspace is not space",
  "narrow\u202fnbsp and medium\u205fmath space",
  "ogham\u1680space mark",
  "control \u0000 nul and \u001f unit separator \u007f del",
  "information separators \u001c\u001d\u001e\u001f are not whitespace",
  "def tokenize(text: str) -> list[int]:\n    return [ord(c) for c in text]  # comment\n",
  "for (int i = 0; i < n; ++i) {\n\tsum += a[i] * b[i];\n}\n",
  "#include <vector>\nint main() { std::vector<int> v{1, 2, 3}; return v.size() != 3; }",
  "SELECT id, name FROM users WHERE email LIKE '%@example.com' ORDER BY id DESC;",
  "{\"key\": \"value\", \"list\": [1, 2.5, -3e10, null, true]}",
  "https://example.com/path/to/page?query=1&other=two#fragment",
  "user@example.org, <a href=\"/x\">link</a>, $HOME/.config, C:\\Windows\\System32",
  "0x7fffffff 1e-9 3.14159265358979 1,000,000 12:30:45 2024-01-31",
  "1234567890123456789012345678901234567890",
  "Numbers: ٠١٢٣٤٥٦٧٨٩ ۰۱۲۳۴۵۶۷۸۹ ०१२३४५६७८९ ০১২৩৪৫৬৭৮৯ ๐๑๒๓๔๕๖๗๘๙ １２３４５",
  "Other numbers: ² ³ ¹ ½ ¾ ⅓ Ⅻ ⅷ ① ⑳ 〇 𝟙𝟚𝟛 ↉",
  "Mixed 12abc 3٤5 x²y ٣dogs 5½",
  "Emoji: 😀 😃 😄 😁 🙂 🤖 🚀 ❤️ ✨ 🎉",
  "Skin tones: 👍 👍🏻 👍🏼 👍🏽 👍🏾 👍🏿 👋🏽👋🏿",
  "ZWJ sequences: 👨‍👩‍👧‍👦 👩‍💻 🏳️‍🌈 🧑🏽‍🚀 👁️‍🗨️",
  "Flags and keycaps: 🇺🇸 🇯🇵 🇩🇪 1️⃣ #️⃣ *️⃣",
  "emoji😀inside😀words",
  "中文分词测试：我们今天去公园散步，天气很好。",
  "日本語のテキスト：ひらがな、カタカナ、漢字が混ざっています。",
  "한국어 문장입니다. 띄어쓰기가 있습니다.",
  "العربية: مَرْحَبًا بِالْعَالَمِ، كيف حالك؟",
  "עברית: שָׁלוֹם עוֹלָם",
  "हिन्दी: नमस्ते दुनिया। यह एक परीक्षण है।",
  "தமிழ்: வணக்கம் உலகம்",
  "ภาษาไทย: สวัสดีชาวโลก",
  "Русский текст: Съешь же ещё этих мягких французских булок, да выпей чаю.",
  "Ελληνικά: Καλημέρα κόσμε",
  "Tiếng Việt: Xin chào thế giới, đây là một bài kiểm tra.",
  "Combining: e\u0301 a\u0308 n\u0303 o\u0302\u0323 precomposed: é ä ñ ộ",
  "Zalgo: Z\u0351\u036b\u0343a\u0352\u036b\u0303l\u0310\u0357g\u0301o\u0300\u0316",
  "Devanagari signs: क्षत्रिय ज्ञान श्री",
  "Variation selectors: ☺︎ ☺️ 葛󠄀",
  "Math: ∀x∈ℝ: x² ≥ 0 ∑ ∫ √ ∞ ≠ ≈ ≤",
  "Currency: $5 €10 £3 ¥100 ₹50 ₿1",
  "Box drawing: ┌─┬─┐ │ │ │ └─┴─┘ ████ ░▒▓",
  "Fullwidth: ＡＢＣ ａｂｃ ！？",
  "Ligatures: ﬁ ﬂ ﬀ Æ æ Œ œ ß ẞ",
  "Supplementary: 𝐀𝐁𝐂 𝔄𝔅 𠀀𠀁 𓀀 🀄",
  "Private use: \ue000\uf8ff",
  "Replacement char: \ufffd and a literal <|endoftext|> in text",
  "<|endoftext|>",
  "a<|endoftext|>b",
  "!!!???...,,,;;;:::---___===+++***&&&%%%$$$###@@@",
  "([{<>}])",
  "\"quoted\" 'single' `backtick`",
  "....................................................................",
  "--------------------------------------------------------------------------",
  "=================================================================",
  "__init__ __main__ ____ a_b_c",
  "camelCaseWord PascalCaseWord snake_case_word kebab-case-word SCREAMING_SNAKE",
  "Dr. Smith's Ph.D. thesis (2019), pp. 12–15; cf. e.g. i.e. etc.",
  "“Smart quotes” ‘single’ — em dash – en dash … ellipsis",
  "Ünïcödé wörds àçcéntéd naïve café résumé façade",
];
handWritten.forEach((text, i) => addText(text, `hand ${i}`));

// Long words and runs: BPE on very long pieces.
addText("a".repeat(1000), "1000 a");
addText("ab".repeat(700), "ab x700");
addText("supercalifragilisticexpialidocious".repeat(40), "long word");
addText(" " + "x".repeat(1500), "space + long word");
addText("9".repeat(1200), "long number");
addText("🤖".repeat(300), "long emoji run");
addText("中".repeat(500), "long CJK run");
addText(" ".repeat(800) + "word", "800 spaces then word");
addText("\n".repeat(300), "300 newlines");
addText(" \t".repeat(300) + "\n", "space-tab run");
addText("!".repeat(900), "long punctuation");
{
  // A base64-looking blob: long, mixed letters and digits and symbols.
  let state = 12345;
  let blob = "";
  const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  for (let i = 0; i < 2000; ++i) {
    state = (state * 1103515245 + 12345) & 0x7fffffff;
    blob += alphabet[state % 64];
  }
  addText(blob, "base64 blob");
}

// Invalid UTF-8: each maximal ill-formed subsequence becomes one U+FFFD.
const invalidByteStrings = [
  [0x80], [0xbf], [0x80, 0x80, 0x80], [0xc0], [0xc1, 0xbf], [0xc0, 0xaf], [0xe0, 0x80, 0xaf],
  [0xf0, 0x80, 0x80, 0xaf], [0xc2], [0xe2, 0x82], [0xf0, 0x9f, 0x98], [0xf0, 0x9f],
  [0xed, 0xa0, 0x80], [0xed, 0xbf, 0xbf], [0xed, 0xa0, 0x80, 0xed, 0xb0, 0x80],
  [0xf4, 0x90, 0x80, 0x80], [0xf5, 0x80, 0x80, 0x80], [0xf8, 0x88, 0x80, 0x80, 0x80],
  [0xfc, 0x84, 0x80, 0x80, 0x80, 0x80], [0xfe], [0xff], [0xfe, 0xff],
  [0xe1, 0x80, 0xe2, 0xf0, 0x91, 0x92, 0xf1, 0xbf, 0x41],
  [0x61, 0xf1, 0x80, 0x80, 0xe1, 0x80, 0xc2, 0x62, 0x80, 0x63, 0x80, 0xbf, 0x64],
  [0x20, 0xff, 0x20, 0xfe, 0x20], [0x48, 0x69, 0xc3], [0xc3, 0x28], [0xa0, 0xa1],
  [0xe2, 0x28, 0xa1], [0xe2, 0x82, 0x28], [0xf0, 0x28, 0x8c, 0xbc], [0xf0, 0x90, 0x28, 0xbc],
  [0xf0, 0x28, 0x8c, 0x28], [0x27, 0xff, 0x73], [0x27, 0x73, 0xff],
];
invalidByteStrings.forEach((bytes, i) => addBytes(bytes, `invalid ${i}`));
// Latin-1 text read as UTF-8, and valid text with invalid bytes spliced in.
addBytes(Buffer.from("caf\xe9 na\xefve r\xe9sum\xe9 \xa9 2024 M\xfcller", "latin1"), "latin1");
addBytes(Buffer.concat([Buffer.from("emoji 😀 cut "), Buffer.from("😀").subarray(0, 3),
  Buffer.from(" then text")]), "truncated emoji");
addBytes(Buffer.concat([Buffer.from("中文"), Buffer.from([0xe4, 0xb8]), Buffer.from("文 end")]),
  "truncated CJK");

// Deterministic random strings over characters chosen to hit the pre-tokenizer's edges:
// spaces of every kind, apostrophes and contraction letters, letters, marks, numbers of
// several scripts, punctuation, emoji pieces, controls.
function makeRandom(seed) {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
const pieces = [
  " ", " ", " ", "  ", "\t", "\n", "\r\n", "\u000b", "\u000c", "\u00a0", "\u2028", "\u3000",
  "\u2003", "'", "'", "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", "'Re", "s", "t",
  "re", "ll", "a", "the", "The", "word", "Hello", "x", "é", "ß", "Ж", "λ", "中", "あ", "한",
  "\u0301", "\u0308", "\u094d", "क", "ि", "0", "7", "42", "٣", "५", "²", "½", "Ⅻ", "１", ".", ",",
  "!", "?", "-", "_", "(", ")", "\"", "#", "€", "→", "😀", "👍🏽", "\u200d", "\ufe0f", "\u0000",
  "\u001c", "\u007f", "\u200b", "🇺🇸",
];
for (let i = 0; i < 800; ++i) {
  const random = makeRandom(1000 + i);
  const length = 1 + Math.floor(random() * 30);
  let text = "";
  for (let j = 0; j < length; ++j) text += pieces[Math.floor(random() * pieces.length)];
  addText(text, `random ${i}`);
}

// Python-only: U+0085 and U+FEFF, where JS and Python disagree on \s.
const pythonOnly = [
  "a\u0085b", "a \u0085b", "a\u0085 b", "a\u0085\u0085b", "line\u0085", "\u0085\u0085\u0085",
  "x \ufeffy", "\ufeffBOM first", "a\ufeff\ufeffb", "end\ufeff", " \ufeff ", "\ufeff\u0085\ufeff",
  "word\u0085 \u0085\tword", "it\ufeff's", "12\u008534",
];
pythonOnly.forEach((text, i) => addText(text, `python-only ${i}`));
for (let i = 0; i < 60; ++i) {
  const random = makeRandom(5000 + i);
  const length = 2 + Math.floor(random() * 20);
  let text = "";
  for (let j = 0; j < length; ++j) {
    const r = random();
    text += r < 0.15 ? "\u0085" : r < 0.3 ? "\ufeff" : pieces[Math.floor(random() * pieces.length)];
  }
  addText(text, `python-only random ${i}`);
}

// Real text: the licenses Debian ships, and lines with non-ASCII characters from the
// packages' copyright files and the X11 compose table on this machine.
function readLines(file) {
  const bytes = fs.readFileSync(file);
  const lines = [];
  let start = 0;
  for (let i = 0; i < bytes.length; ++i) {
    if (bytes[i] === 0x0a) { lines.push(bytes.subarray(start, i + 1)); start = i + 1; }
  }
  if (start < bytes.length) lines.push(bytes.subarray(start));
  return lines;
}
function addChunks(lines, linesPerChunk, label) {
  for (let i = 0; i < lines.length; i += linesPerChunk) {
    addBytes(Buffer.concat(lines.slice(i, i + linesPerChunk)), `${label} line ${i + 1}`);
  }
}
const licenseDir = "/usr/share/common-licenses";
const seen = new Set();
for (const name of fs.readdirSync(licenseDir).sort()) {
  const real = fs.realpathSync(path.join(licenseDir, name));
  if (seen.has(real)) continue;
  seen.add(real);
  addChunks(readLines(real), 8, real);
}
const docDir = "/usr/share/doc";
const nonAsciiLines = [];
const seenLines = new Set();
for (const name of fs.readdirSync(docDir).sort()) {
  const file = path.join(docDir, name, "copyright");
  if (!fs.existsSync(file)) continue;
  const real = fs.realpathSync(file);
  if (seen.has(real)) continue;
  seen.add(real);
  for (const line of readLines(real)) {
    if (!line.some((b) => b >= 0x80)) continue;
    const key = hex(line);
    if (seenLines.has(key)) continue;
    seenLines.add(key);
    nonAsciiLines.push(line);
  }
}
addChunks(nonAsciiLines.slice(0, 1500), 3, "copyright non-ASCII");
const compose = "/usr/share/X11/locale/en_US.UTF-8/Compose";
if (fs.existsSync(compose)) {
  const lines = readLines(compose).filter((line) => line.some((b) => b >= 0x80));
  addChunks(lines.slice(0, 600), 4, "X11 Compose");
}

// ---------------------------------------------------------------- encode and compare
const isPythonOnly = (text) => /[\u0085\ufeff]/.test(text);
const pythonInput = corpus.map((entry) =>
  entry.bytes ? { bytes_hex: hex(entry.bytes) } : entry.text);
const pythonOutput = JSON.parse(execFileSync("python3", [
  path.join(here, "gpt2_reference_encoder.py"),
  path.join(dataDir, "gpt2-vocab.json"), path.join(dataDir, "gpt2-merges.txt"),
], { input: JSON.stringify(pythonInput), maxBuffer: 1 << 30 }).toString());

const sameIds = (a, b) => a.length === b.length && a.every((x, i) => x === b[i]);
const lines = [];
let gpt3Disagreements = 0;
let failures = 0;
let pythonOnlyCount = 0;
let invalidCount = 0;
corpus.forEach((entry, index) => {
  const text = entry.bytes ? utf8Decoder.decode(entry.bytes) : entry.text;
  const python = pythonOutput[index];
  const record = {};
  if (entry.bytes) {
    const decodedHex = hex(utf8Encoder.encode(text));
    if (decodedHex !== python.decoded_hex) {
      console.error(`decoders disagree on ${entry.label}: ${decodedHex} vs ${python.decoded_hex}`);
      ++failures;
    }
    record.bytes_hex = hex(entry.bytes);
    record.decoded_hex = decodedHex;
    ++invalidCount;
  } else {
    record.text = text;
  }
  if (isPythonOnly(text)) {
    record.python_only = true;
    record.ids = python.ids;
    ++pythonOnlyCount;
  } else {
    const tiktokenIds = tiktoken.encode(text, [], []);
    const gpt3Ids = gpt3Encoder.encode(text);
    if (!sameIds(tiktokenIds, python.ids)) {
      console.error(`js-tiktoken and the Python reference disagree on ${entry.label}: ` +
        `${JSON.stringify(text).slice(0, 200)}`);
      ++failures;
    }
    if (!sameIds(gpt3Ids, tiktokenIds)) {
      ++gpt3Disagreements;
      console.error(`gpt-3-encoder disagrees on ${entry.label}: ${JSON.stringify(text).slice(0, 120)}`);
    }
    record.ids = tiktokenIds;
  }
  lines.push(JSON.stringify(record));
});
if (failures > 0) {
  console.error(`${failures} disagreements between references: no fixtures written`);
  process.exit(1);
}
fs.writeFileSync(outputPath, lines.join("\n") + "\n");
console.log(`${lines.length} fixtures (${invalidCount} invalid UTF-8, ${pythonOnlyCount} ` +
  `Python-only) written to ${outputPath}; gpt-3-encoder disagreed on ${gpt3Disagreements}`);
