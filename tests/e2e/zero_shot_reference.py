#!/usr/bin/python3
"""Independent PyTorch reference of evaluate_gpt's zero-shot metrics (Megatron-LM's
tasks/zeroshot_gpt: WIKITEXT103 word-level perplexity and LAMBADA cloze accuracy), for
tests/e2e/evaluate_gpt_test.cpp.

Everything is written here from the published semantics, sharing no code with the C++ side:
the GPT-2 byte-level BPE (OpenAI's algorithm; the pre-tokenization pattern in Python's `re`,
where [^\\W\\d_] stands for \\p{L} and \\d for \\p{N}, which agree on the test's text), the
WikiText detokenizer (as a list of substitutions), the word count (len(text.strip().split(" "))),
the windows (derived here from which targets each window is meant to score, and checked to score
every target exactly once), the LAMBADA targets, and a float64 GPT-2 forward of the Hugging Face
export (checkpoint_util --export-hf: GPT2LMHeadModel, padded vocabulary) from the safetensors
format.

Usage:
  zero_shot_reference.py HF_DIR VOCAB_JSON MERGES_TXT TASK FILE SEQ_LENGTH OVERLAPPING_EVAL STRICT
prints one JSON object: WIKITEXT103's total_loss, avg_loss, ppl, adjusted_ppl, token_ratio,
num_original_tokens, num_tokenized_tokens; LAMBADA's number_correct, total_examples,
avg_accuracy and per-example "correct".
"""
import json
import math
import os
import re
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "backend", "ckpt"))
from pytorch_reference import read_safetensors  # noqa: E402  (the safetensors reader only)

# ---- GPT-2 byte-level BPE

PATTERN = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d+| ?(?:[^\s\w]|_)+|\s+(?!\S)|\s+""")


def byte_alphabet():
    kept = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    table, extra = {}, 0
    for b in range(256):
        if b in kept:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


class Gpt2Bpe:
    def __init__(self, vocab_path, merges_path):
        with open(vocab_path, encoding="utf-8") as f:
            self.vocab = json.load(f)
        with open(merges_path, encoding="utf-8") as f:
            lines = [line for line in f.read().split("\n")[1:] if line]
        self.rank = {tuple(line.split()): i for i, line in enumerate(lines)}
        self.alphabet = byte_alphabet()

    def word_pieces(self, word):
        """OpenAI's loop: merge every occurrence of the lowest-ranked adjacent pair, until none ranks."""
        parts = list(word)
        while len(parts) > 1:
            rank, pair = min((self.rank.get(pair, math.inf), pair) for pair in zip(parts, parts[1:]))
            if rank == math.inf:
                break
            merged, i = [], 0
            while i < len(parts):
                if i + 1 < len(parts) and (parts[i], parts[i + 1]) == pair:
                    merged.append(parts[i] + parts[i + 1])
                    i += 2
                else:
                    merged.append(parts[i])
                    i += 1
            parts = merged
        return parts

    def encode(self, text):
        ids = []
        for piece in PATTERN.findall(text):
            word = "".join(self.alphabet[b] for b in piece.encode("utf-8"))
            ids.extend(self.vocab[p] for p in self.word_pieces(word))
        return ids


# ---- WikiText detokenizer: the substitutions in order

def tighten(text, opening, closing):
    """From each `opening` to the next `closing`, the text between loses its outer whitespace."""
    pattern = re.escape(opening) + r"\s*([^" + re.escape(closing) + r"]*?)\s*" + re.escape(closing)
    return re.sub(pattern, lambda match: opening + match.group(1) + closing, text)


def wikitext_detokenize(text):
    for old, new in [("s '", "s'")]:
        text = text.replace(old, new)
    text = re.sub(r"/' [0-9]/", lambda match: "/'[0-9]/", text)  # Megatron's literal pattern
    for old, new in [(" @-@ ", "-"), (" @,@ ", ","), (" @.@ ", "."), (" : ", ": "), (" ; ", "; "),
                     (" . ", ". "), (" ! ", "! "), (" ? ", "? "), (" , ", ", ")]:
        text = text.replace(old, new)
    for opening, closing in ["()", "[]", "{}", '""', "''"]:
        text = tighten(text, opening, closing)
    for old, new in [("= = = =", "===="), ("= = =", "==="), ("= =", "=="), (" \u00b0 ", "\u00b0"),
                     (" \n", "\n"), ("\n ", "\n"), (" N ", " 1 "), (" 's", "'s")]:
        text = text.replace(old, new)
    return text


# ---- GPT-2 forward (GPT2LMHeadModel: Conv1D weights (in, out), gelu_new, tied lm_head)

def gpt2_logits(p, config, tokens):
    C, NH, eps = config["n_embd"], config["n_head"], config["layer_norm_epsilon"]
    B, T = tokens.shape
    x = p["transformer.wte.weight"][tokens] + p["transformer.wpe.weight"][torch.arange(T)]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(config["n_layer"]):
        h = f"transformer.h.{i}."
        a = F.layer_norm(x, (C,), p[h + "ln_1.weight"], p[h + "ln_1.bias"], eps)
        q, k, v = (a @ p[h + "attn.c_attn.weight"] + p[h + "attn.c_attn.bias"]).split(C, dim=2)
        q, k, v = (t.reshape(B, T, NH, C // NH).transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(C // NH)
        attention = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1) @ v
        x = x + attention.transpose(1, 2).reshape(B, T, C) @ p[h + "attn.c_proj.weight"] + p[h + "attn.c_proj.bias"]
        m = F.layer_norm(x, (C,), p[h + "ln_2.weight"], p[h + "ln_2.bias"], eps)
        m = F.gelu(m @ p[h + "mlp.c_fc.weight"] + p[h + "mlp.c_fc.bias"], approximate="tanh")
        x = x + m @ p[h + "mlp.c_proj.weight"] + p[h + "mlp.c_proj.bias"]
    x = F.layer_norm(x, (C,), p["transformer.ln_f.weight"], p["transformer.ln_f.bias"], eps)
    return x @ p["transformer.wte.weight"].t()  # (B, T, padded vocabulary)


def window_input(ids, start, seq_length, pad):
    window = ids[start:start + seq_length + 1]
    return window + [pad] * (seq_length + 1 - len(window))


def wikitext(model, bpe, path, seq_length, overlap, pad):
    with open(path, encoding="utf-8") as f:
        raw = f.read()
    original = len(raw.strip().split(" "))
    ids = bpe.encode(wikitext_detokenize(raw))
    targets = len(ids) - 1
    # Window w covers ids [w·overlap, w·overlap + seq_length]; the first scores all its targets,
    # each later one only the targets no earlier window reached (the last `overlap` positions).
    total, scored, w = 0.0, [0] * len(ids), 0
    while True:
        start = w * overlap
        window = window_input(ids, start, seq_length, pad)
        logits = model(torch.tensor([window[:-1]]))[0]
        losses = F.cross_entropy(logits, torch.tensor(window[1:]), reduction="none")
        for position in range(seq_length):
            target = start + position + 1
            if target <= targets and (w == 0 or position >= seq_length - overlap):
                total += losses[position].item()
                scored[target] += 1
        if start + seq_length >= targets:
            break
        w += 1
    assert scored[1:] == [1] * targets, "a target was scored other than once"
    avg = total / targets
    ratio = targets / (original - 1)
    return {"total_loss": total, "avg_loss": avg, "ppl": math.exp(min(20, avg)),
            "adjusted_ppl": math.exp(min(20, avg * ratio)), "token_ratio": ratio,
            "num_original_tokens": original, "num_tokenized_tokens": len(ids)}


def lambada(model, bpe, path, seq_length, strict, pad):
    correct = []
    with open(path, encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f if line.strip()]
    for text in texts:
        if strict:
            word = text.split()[-1]
            context = bpe.encode(text[:text.rfind(word)].strip())
            target = bpe.encode(" " + word)
        else:
            ids = bpe.encode(text)
            context, target = ids[:-1], ids[-1:]
        window = window_input(context + target, 0, seq_length, pad)
        predicted = model(torch.tensor([window[:-1]]))[0].argmax(-1).tolist()
        # Position p predicts id p + 1: the target ids are ids |context| .. |context|+|target|-1.
        correct.append(all(predicted[len(context) - 1 + i] == t for i, t in enumerate(target)))
    return {"number_correct": sum(correct), "total_examples": len(correct),
            "avg_accuracy": sum(correct) / len(correct), "correct": correct}


def main():
    if len(sys.argv) != 9:
        print(__doc__)
        return 2
    hf, vocab, merges, task, path, seq_length, overlap, strict = sys.argv[1:]
    seq_length, overlap, strict = int(seq_length), int(overlap), strict == "1"
    torch.set_num_threads(1)
    with open(os.path.join(hf, "config.json")) as f:
        config = json.load(f)
    if config.get("model_type") != "gpt2":
        print(f"model_type {config.get('model_type')!r}: this reference builds gpt2 only")
        return 2
    parameters = read_safetensors(os.path.join(hf, "model.safetensors"))  # float64
    bpe = Gpt2Bpe(vocab, merges)
    pad = bpe.vocab["<|endoftext|>"]

    def model(tokens):
        with torch.no_grad():
            return gpt2_logits(parameters, config, tokens)

    if task == "WIKITEXT103":
        result = wikitext(model, bpe, path, seq_length, overlap, pad)
    else:
        result = lambada(model, bpe, path, seq_length, strict, pad)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
