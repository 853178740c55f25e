#!/usr/bin/env python3
# Writes the golden outputs of tests/data/preprocess_sample.jsonl for the preprocess_data test:
# an independent transcription, in plain Python (struct, no numpy), of what Megatron-LM's
# tools/preprocess_data.py does with --append-eod and GPT2BPETokenizer:
#   Encoder.encode: each key's value is a string or a list of sentences; a sentence with no
#     tokens is dropped; with --append-eod a document with tokens gets eod appended and its
#     last sentence length grows by one;
#   IndexedDatasetBuilder.add_document: tokens to the .bin, the lengths to sequence_lengths,
#     len(sequence_lengths) to document_indices (which starts as [0]);
#   _IndexWriter.write: b"MMIDIDX\x00\x00", <Q version 1, <B dtype code (8: uint16, the
#     optimal dtype below 65,500 ids), <Q sequence count, <Q len(document_indices), int32
#     lengths, int64 byte pointers, int64 document indices.
# Tokens come from gpt2_reference_encoder.py (OpenAI's algorithm over Python's `regex`).
# Usage: megatron_preprocess_reference.py INPUT_JSONL OUTPUT_PREFIX KEY...
#   writes OUTPUT_PREFIX_<key>_document.bin/.idx
import json
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt2_reference_encoder import Gpt2Reference  # noqa: E402

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def main():
    input_path, output_prefix, keys = sys.argv[1], sys.argv[2], sys.argv[3:]
    tokenizer = Gpt2Reference(os.path.join(DATA, "gpt2-vocab.json"),
                              os.path.join(DATA, "gpt2-merges.txt"))
    dtype_code, item_format = (8, "<H") if len(tokenizer.encoder) < 65500 else (4, "<i")
    outputs = {key: {"data": bytearray(), "lengths": [], "documents": [0]} for key in keys}
    with open(input_path, encoding="utf-8") as f:
        for line in f:
            document = json.loads(line)
            for key in keys:
                value = document[key]
                sentences = value if isinstance(value, list) else [value]
                ids, lengths = [], []
                for sentence in sentences:
                    _, sentence_ids = tokenizer.encode(sentence)
                    if sentence_ids:
                        ids.extend(sentence_ids)
                        lengths.append(len(sentence_ids))
                if ids:
                    ids.append(tokenizer.eod)
                    lengths[-1] += 1
                output = outputs[key]
                for token in ids:
                    output["data"] += struct.pack(item_format, token)
                output["lengths"].extend(lengths)
                output["documents"].append(len(output["lengths"]))
    item_size = struct.calcsize(item_format)
    for key, output in outputs.items():
        prefix = f"{output_prefix}_{key}_document"
        with open(prefix + ".bin", "wb") as f:
            f.write(output["data"])
        with open(prefix + ".idx", "wb") as f:
            f.write(b"MMIDIDX\x00\x00")
            f.write(struct.pack("<Q", 1))
            f.write(struct.pack("<B", dtype_code))
            f.write(struct.pack("<Q", len(output["lengths"])))
            f.write(struct.pack("<Q", len(output["documents"])))
            for length in output["lengths"]:
                f.write(struct.pack("<i", length))
            pointer = 0
            for length in output["lengths"]:
                f.write(struct.pack("<q", pointer))
                pointer += length * item_size
            for index in output["documents"]:
                f.write(struct.pack("<q", index))


if __name__ == "__main__":
    main()
