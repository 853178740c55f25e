"""PyTorch reference for the CPU training-step benchmark (tests/bench/cpu_vs_pytorch_bench.sh).

The same GPT as pretrain_gpt builds for the gpt3/126m shape (Megatron's GPT: learned positions,
pre-LN, fused qkv, causal softmax attention, GELU (tanh), output tied to the word embedding,
padded vocabulary), trained with the same hyperparameters (AdamW, global-norm clipping at 1.0,
no dropout) on random tokens, fp32 on the CPU, written the way a PyTorch user would (nanoGPT's
non-flash attention path: torch 1.13 has no scaled_dot_product_attention). Prints one JSON
line: median seconds per iteration over the iterations after the first, tokens/s, threads.

Usage: /usr/bin/python3 pytorch_gpt_reference.py --seq 256 --mbs 4 --iterations 6 --threads 2
"""
import argparse
import json
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, hidden, heads, ffn):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(hidden, eps=1e-5)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln_2 = nn.LayerNorm(hidden, eps=1e-5)
        self.fc1 = nn.Linear(hidden, ffn)
        self.fc2 = nn.Linear(ffn, hidden)

    def forward(self, x, causal_mask):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln_1(x)).split(C, dim=2)
        q = q.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        k = k.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        v = v.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        scores = scores.masked_fill(causal_mask[:, :, :T, :T] == 0, float("-inf"))
        context = (F.softmax(scores, dim=-1) @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.proj(context)
        return x + self.fc2(F.gelu(self.fc1(self.ln_2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, layers, hidden, heads, vocab, positions, seq):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, hidden)
        self.position_embeddings = nn.Embedding(positions, hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads, 4 * hidden) for _ in range(layers))
        self.final_layernorm = nn.LayerNorm(hidden, eps=1e-5)
        self.register_buffer("causal_mask", torch.tril(torch.ones(seq, seq)).view(1, 1, seq, seq))
        for name, p in self.named_parameters():
            if p.dim() > 1:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith(("proj.weight", "fc2.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, tokens, labels):
        T = tokens.size(1)
        x = self.word_embeddings(tokens) + self.position_embeddings(torch.arange(T))
        for block in self.blocks:
            x = block(x, self.causal_mask)
        logits = self.final_layernorm(x) @ self.word_embeddings.weight.t()
        return F.cross_entropy(logits.view(-1, logits.size(-1)), labels.view(-1))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--vocab", type=int, default=50304)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--mbs", type=int, default=4)
    parser.add_argument("--iterations", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    torch.manual_seed(1234)
    torch.set_num_threads(args.threads)
    model = Gpt(args.layers, args.hidden, args.heads, args.vocab, 2048, args.seq)
    no_decay = [p for n, p in model.named_parameters() if p.dim() == 1]
    decay = [p for n, p in model.named_parameters() if p.dim() > 1]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=6e-4, betas=(0.9, 0.999), eps=1e-8)
    seconds = []
    for _ in range(args.iterations):
        tokens = torch.randint(0, 50257, (args.mbs, args.seq))
        labels = torch.randint(0, 50257, (args.mbs, args.seq))
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = model(tokens, labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        seconds.append(time.perf_counter() - start)
    median = statistics.median(seconds[1:] if len(seconds) > 1 else seconds)
    print(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads(),
                      "median_seconds_per_iteration": median,
                      "tokens_per_second": args.mbs * args.seq / median,
                      "last_loss": loss.item()}))


if __name__ == "__main__":
    main()
