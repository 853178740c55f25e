#!/usr/bin/env python3
# An independent GPT-2 encoder with OpenAI's exact Python semantics, used only by
# make_tokenizer_fixtures.mjs: the JavaScript references split text with JS regular expressions,
# whose \s differs from Python's (U+0085, U+FEFF), so for text where the two differ the
# fixtures come from this script. It is written from the algorithm of OpenAI's gpt-2
# src/encoder.py (the one Megatron's gpt2_tokenization.py carries): the pre-tokenization
# pattern matched by the third-party `regex` module (the engine OpenAI uses; \s is Unicode
# White_Space there), bytes mapped to printable characters, then the original BPE loop that
# merges every occurrence of the lowest-ranked pair per pass.
#
# Protocol: reads a JSON array on stdin whose items are strings or {"bytes_hex": "..."} (bytes,
# decoded as Python's bytes.decode("utf-8", "replace") does), writes a JSON array of
# {"pieces": [...], "ids": [...], "decoded_hex": "..."} on stdout.
# Usage: gpt2_reference_encoder.py VOCAB_JSON MERGES_TXT < texts.json > encoded.json
import json
import sys

import regex

PATTERN = regex.compile(
    r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")


def byte_to_character():
    # The 188 printable bytes keep their code point; the other 68 move to U+0100 onwards.
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) +
                 list(range(ord("®"), ord("ÿ") + 1)))
    mapping = {b: chr(b) for b in printable}
    next_code_point = 256
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(next_code_point)
            next_code_point += 1
    return mapping


class Gpt2Reference:
    """OpenAI's encoder: text → (pre-tokenization pieces, ids)."""

    def __init__(self, vocab_path, merges_path):
        with open(vocab_path, encoding="utf-8") as f:
            self.encoder = json.load(f)
        with open(merges_path, encoding="utf-8") as f:
            merge_lines = f.read().split("\n")[1:-1]
        self.ranks = {tuple(line.split()): rank for rank, line in enumerate(merge_lines)}
        self.byte_map = byte_to_character()
        self.cache = {}
        self.eod = self.encoder["<|endoftext|>"]

    def bpe(self, word):
        if word in self.cache:
            return self.cache[word]
        symbols = list(word)
        while len(symbols) > 1:
            pairs = {(symbols[i], symbols[i + 1]) for i in range(len(symbols) - 1)}
            best = min(pairs, key=lambda pair: self.ranks.get(pair, float("inf")))
            if best not in self.ranks:
                break
            merged = []
            i = 0
            while i < len(symbols):
                if i + 1 < len(symbols) and symbols[i] == best[0] and symbols[i + 1] == best[1]:
                    merged.append(best[0] + best[1])
                    i += 2
                else:
                    merged.append(symbols[i])
                    i += 1
            symbols = merged
        self.cache[word] = symbols
        return symbols

    def encode(self, text):
        pieces = PATTERN.findall(text)
        ids = []
        for piece in pieces:
            word = "".join(self.byte_map[b] for b in piece.encode("utf-8"))
            ids.extend(self.encoder[symbol] for symbol in self.bpe(word))
        return pieces, ids


def main():
    reference = Gpt2Reference(sys.argv[1], sys.argv[2])
    results = []
    for item in json.load(sys.stdin):
        if isinstance(item, str):
            text = item
        else:
            text = bytes.fromhex(item["bytes_hex"]).decode("utf-8", "replace")
        pieces, ids = reference.encode(text)
        results.append({"pieces": pieces, "ids": ids,
                        "decoded_hex": text.encode("utf-8").hex()})
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
