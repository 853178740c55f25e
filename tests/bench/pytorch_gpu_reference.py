"""PyTorch reference for the GPU training benchmark (tests/bench/gpu_vs_pytorch_bench.sh).

A nanoGPT-style script of the models pretrain_gpt trains, written the way a PyTorch user gets
the most from one GPU: torch.compile, scaled_dot_product_attention (flash attention), fused
AdamW, bf16 autocast with fp32 master weights, TF32 off (pretrain_gpt's GEMMs do not use it
either). Two model styles, as pretrain_gpt's flags build them:
  gpt2:  learned positions, LayerNorm, GELU (tanh), biases, output tied to the word embedding
  llama: RoPE (base 10000, non-interleaved halves), RMSNorm, SwiGLU, grouped-query attention,
         no biases, untied output layer
Same hyperparameters as the benchmark's pretrain_gpt runs (AdamW lr 6e-4, betas 0.9/0.95,
eps 1e-8, weight decay 0.1 on matrices, global-norm clipping at 1.0, no dropout), random
tokens. Prints one JSON line: median seconds per iteration over the iterations after the
warm-up ones, tokens/s, peak memory (torch.cuda.max_memory_allocated and _reserved).

Also `--measure-peak`: the bf16 GEMM peak of this card (8192³ products, best of ten after
warm-up), the MFU denominator, printed as {"bf16_gemm_tflops": ...}.

Usage: python3 pytorch_gpu_reference.py --style gpt2 --layers 12 --hidden 768 --heads 12 \
         --seq 1024 --mbs 16 --iterations 30
       python3 pytorch_gpu_reference.py --measure-peak
"""
import argparse
import json
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def rotate_half_rope(x, cos, sin):
    half = x.size(-1) // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class RMSNorm(nn.Module):
    def __init__(self, hidden, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden))

    def forward(self, x):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


class Block(nn.Module):
    def __init__(self, style, hidden, heads, groups, ffn):
        super().__init__()
        self.style, self.heads, self.groups = style, heads, groups
        self.head_dim = hidden // heads
        bias = style == "gpt2"
        norm = (lambda: nn.LayerNorm(hidden, eps=1e-5)) if style == "gpt2" else (lambda: RMSNorm(hidden))
        self.input_norm, self.mlp_norm = norm(), norm()
        self.qkv = nn.Linear(hidden, (heads + 2 * groups) * self.head_dim, bias=bias)
        self.proj = nn.Linear(hidden, hidden, bias=bias)
        self.fc1 = nn.Linear(hidden, ffn * (2 if style == "llama" else 1), bias=bias)
        self.fc2 = nn.Linear(ffn, hidden, bias=bias)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        D = self.head_dim
        q, k, v = self.qkv(self.input_norm(x)).split(
            [self.heads * D, self.groups * D, self.groups * D], dim=2)
        q = q.view(B, T, self.heads, D).transpose(1, 2)
        k = k.view(B, T, self.groups, D).transpose(1, 2)
        v = v.view(B, T, self.groups, D).transpose(1, 2)
        if self.style == "llama":
            q, k = rotate_half_rope(q, cos, sin), rotate_half_rope(k, cos, sin)
        context = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                 enable_gqa=self.groups != self.heads)
        x = x + self.proj(context.transpose(1, 2).contiguous().view(B, T, C))
        hidden = self.fc1(self.mlp_norm(x))
        if self.style == "llama":
            gate, up = hidden.chunk(2, dim=-1)
            hidden = F.silu(gate) * up
        else:
            hidden = F.gelu(hidden, approximate="tanh")
        return x + self.fc2(hidden)


class Gpt(nn.Module):
    def __init__(self, style, layers, hidden, heads, groups, ffn, vocab, seq):
        super().__init__()
        self.style = style
        self.word_embeddings = nn.Embedding(vocab, hidden)
        if style == "gpt2":
            self.position_embeddings = nn.Embedding(seq, hidden)
            self.final_norm = nn.LayerNorm(hidden, eps=1e-5)
        else:
            self.final_norm = RMSNorm(hidden)
            self.output_layer = nn.Linear(hidden, vocab, bias=False)
            head_dim = hidden // heads
            inverse = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
            angles = torch.outer(torch.arange(seq).float(), inverse)  # (seq, head_dim / 2): one per pair
            self.register_buffer("cos", angles.cos()[None, None], persistent=False)
            self.register_buffer("sin", angles.sin()[None, None], persistent=False)
        self.blocks = nn.ModuleList(Block(style, hidden, heads, groups, ffn) for _ in range(layers))
        for name, p in self.named_parameters():
            if p.dim() > 1:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith(("proj.weight", "fc2.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, tokens, labels):
        T = tokens.size(1)
        x = self.word_embeddings(tokens)
        cos = sin = None
        if self.style == "gpt2":
            x = x + self.position_embeddings(torch.arange(T, device=tokens.device))
        else:
            cos, sin = self.cos[:, :, :T], self.sin[:, :, :T]
        for block in self.blocks:
            x = block(x, cos, sin)
        x = self.final_norm(x)
        weight = self.word_embeddings.weight if self.style == "gpt2" else self.output_layer.weight
        logits = x @ weight.t()
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), labels.view(-1))


def measure_peak():
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    best = math.inf
    for _ in range(10):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) / 1000)
    print(json.dumps({"bf16_gemm_tflops": 2 * 8192**3 / best / 1e12,
                      "device": torch.cuda.get_device_name()}))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--measure-peak", action="store_true")
    parser.add_argument("--style", choices=["gpt2", "llama"], default="gpt2")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--groups", type=int, default=0, help="key/value heads (0: = heads)")
    parser.add_argument("--ffn", type=int, default=0, help="MLP width (0: 4 × hidden)")
    parser.add_argument("--vocab", type=int, default=50304)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--mbs", type=int, default=16)
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--no-compile", action="store_true")
    args = parser.parse_args()
    if args.measure_peak:
        measure_peak()
        return

    torch.manual_seed(1234)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    groups = args.groups or args.heads
    ffn = args.ffn or 4 * args.hidden
    model = Gpt(args.style, args.layers, args.hidden, args.heads, groups, ffn, args.vocab,
                args.seq).cuda()
    decay = [p for p in model.parameters() if p.dim() > 1]
    no_decay = [p for p in model.parameters() if p.dim() <= 1]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=6e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    step_model = model if args.no_compile else torch.compile(model)
    seconds = []
    for _ in range(args.warmup + args.iterations):
        tokens = torch.randint(0, args.vocab, (args.mbs, args.seq), device="cuda")
        labels = torch.randint(0, args.vocab, (args.mbs, args.seq), device="cuda")
        torch.cuda.synchronize()
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            loss = step_model(tokens, labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        loss_value = loss.item()  # pretrain_gpt reads its loss back every step too
        seconds.append(time.perf_counter() - start)
    median = statistics.median(seconds[args.warmup:])
    print(json.dumps({"torch": torch.__version__, "device": torch.cuda.get_device_name(),
                      "median_seconds_per_iteration": median,
                      "tokens_per_second": args.mbs * args.seq / median,
                      "max_memory_allocated": torch.cuda.max_memory_allocated(),
                      "max_memory_reserved": torch.cuda.max_memory_reserved(),
                      "parameters": sum(p.numel() for p in model.parameters()),
                      "last_loss": loss_value}))


if __name__ == "__main__":
    main()
