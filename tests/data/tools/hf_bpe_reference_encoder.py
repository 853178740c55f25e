#!/usr/bin/env python3
# An independent encoder for a byte-level BPE tokenizer.json with Hugging Face `tokenizers`'
# semantics, used only by make_llama3_fixtures.mjs: llama3-tokenizer-js splits text with a
# JavaScript regular expression, whose \s differs from Oniguruma's and Python's (U+0085, U+FEFF)
# and whose case-insensitive contractions miss U+017F (ſ, which folds to s), so for text holding
# any of these the fixtures come from this script; for all other text it must agree with
# llama3-tokenizer-js. Written from the algorithm: added tokens split out first (leftmost, then
# longest), the Split regex of the file matched by the third-party `regex` module (\s is
# Unicode White_Space there, as in Oniguruma), bytes mapped to printable characters, a pre-token
# that is a vocabulary entry kept whole when ignore_merges is set, otherwise the lowest-ranked
# pair merged until none is left; then the post-processor template's special tokens around.
#
# Protocol: reads a JSON array of strings on stdin, writes a JSON array of id lists on stdout.
# Usage: hf_bpe_reference_encoder.py TOKENIZER_JSON < texts.json > ids.json
import json
import sys

import regex


def byte_to_character():
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) +
                 list(range(ord("®"), ord("ÿ") + 1)))
    mapping = {b: chr(b) for b in printable}
    next_code_point = 256
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(next_code_point)
            next_code_point += 1
    return mapping


class Reference:
    def __init__(self, path):
        with open(path, encoding="utf-8") as f:
            tokenizer = json.load(f)
        model = tokenizer["model"]
        self.vocab = model["vocab"]
        self.ignore_merges = model.get("ignore_merges", False)
        self.ranks = {}
        for rank, merge in enumerate(model["merges"]):
            pair = tuple(merge.split(" ")) if isinstance(merge, str) else tuple(merge)
            self.ranks[pair] = rank
        self.added = {t["content"]: t["id"] for t in tokenizer["added_tokens"]}
        self.added_first = {content[0] for content in self.added}
        split = tokenizer["pre_tokenizer"]["pretokenizers"][0]
        self.pattern = regex.compile(split["pattern"]["Regex"])
        self.prefix = []
        for processor in tokenizer["post_processor"]["processors"]:
            if processor["type"] == "TemplateProcessing":
                for piece in processor["single"]:
                    if "SpecialToken" in piece:
                        name = piece["SpecialToken"]["id"]
                        self.prefix += processor["special_tokens"][name]["ids"]
                    else:
                        break
        self.byte_map = byte_to_character()

    def bpe(self, word):
        if self.ignore_merges and word in self.vocab:
            return [self.vocab[word]]
        symbols = list(word)
        while len(symbols) > 1:
            ranked = [(self.ranks.get((symbols[i], symbols[i + 1]), float("inf")), i)
                      for i in range(len(symbols) - 1)]
            best_rank, _ = min(ranked)
            if best_rank == float("inf"):
                break
            pair = next((symbols[i], symbols[i + 1]) for r, i in ranked if r == best_rank)
            merged, i = [], 0
            while i < len(symbols):
                if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == pair:
                    merged.append(symbols[i] + symbols[i + 1])
                    i += 2
                else:
                    merged.append(symbols[i])
                    i += 1
            symbols = merged
        return [self.vocab[s] for s in symbols]

    def encode_plain(self, text, ids):
        for piece in self.pattern.findall(text):
            word = "".join(self.byte_map[b] for b in piece.encode("utf-8"))
            ids += self.bpe(word)

    def encode(self, text):
        ids = list(self.prefix)
        start = i = 0
        while i < len(text):
            if text[i] not in self.added_first:
                i += 1
                continue
            match = max((c for c in self.added if text.startswith(c, i)), key=len, default=None)
            if match is None:
                i += 1
                continue
            self.encode_plain(text[start:i], ids)
            ids.append(self.added[match])
            i = start = i + len(match)
        self.encode_plain(text[start:], ids)
        return ids


def main():
    reference = Reference(sys.argv[1])
    texts = json.load(sys.stdin)
    json.dump([reference.encode(text) for text in texts], sys.stdout)


if __name__ == "__main__":
    main()
