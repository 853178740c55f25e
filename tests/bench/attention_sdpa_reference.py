"""PyTorch's side of tests/bench/attention_vs_sdpa_bench.sh: causal scaled_dot_product_attention
forward and backward on the GPU benchmark's three shapes in bf16, timed with CUDA events the
way attention_bench times ours (each direction repeated, the device waited for once), with
whatever kernel PyTorch's dispatcher picks on this card (flash or cuDNN on Hopper). Grouped
query attention through enable_gqa where this PyTorch has it, else K and V repeated per group
(outside the timed region). The same FLOPs as attention_bench: causal 2·B·T²·C forward, 2.5
times that backward. Prints one JSON line per shape.

Usage: python3 attention_sdpa_reference.py [repetitions]
"""
import inspect
import json
import sys

import torch
import torch.nn.functional as F

SHAPES = [("gpt2-124m", 16, 1024, 12, 12, 64), ("gpt2-350m", 8, 1024, 16, 16, 64),
          ("llama-1b", 4, 2048, 32, 8, 64)]


def timed(function, repetitions):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repetitions):
        function()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repetitions  # milliseconds


def main():
    repetitions = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    gqa = "enable_gqa" in inspect.signature(F.scaled_dot_product_attention).parameters
    for name, batch, seq, heads, groups, head_dim in SHAPES:
        device, dtype = "cuda", torch.bfloat16
        q = torch.randn(batch, heads, seq, head_dim, device=device, dtype=dtype, requires_grad=True)
        k = torch.randn(batch, groups, seq, head_dim, device=device, dtype=dtype, requires_grad=True)
        v = torch.randn(batch, groups, seq, head_dim, device=device, dtype=dtype, requires_grad=True)
        if groups != heads and not gqa:
            k = k.detach().repeat_interleave(heads // groups, dim=1).requires_grad_()
            v = v.detach().repeat_interleave(heads // groups, dim=1).requires_grad_()
        options = {"is_causal": True}
        if groups != heads and gqa:
            options["enable_gqa"] = True
        out = F.scaled_dot_product_attention(q, k, v, **options)
        grad = torch.randn_like(out)
        out.backward(grad)  # warm-up: kernel selection, caches
        torch.cuda.synchronize()
        forward_ms = timed(lambda: F.scaled_dot_product_attention(q, k, v, **options), repetitions)
        out = F.scaled_dot_product_attention(q, k, v, **options)
        backward_ms = timed(lambda: torch.autograd.grad(out, (q, k, v), grad, retain_graph=True),
                            repetitions)
        flops = 2.0 * batch * seq * seq * heads * head_dim
        print(json.dumps({"shape": name, "backend": "pytorch-sdpa", "forward_ms": round(forward_ms, 4),
                          "backward_ms": round(backward_ms, 4),
                          "forward_tflops": round(flops / forward_ms / 1e9, 2),
                          "backward_tflops": round(2.5 * flops / backward_ms / 1e9, 2),
                          "torch": torch.__version__, "gqa": "enable_gqa" if gqa else "repeated"}),
              flush=True)


if __name__ == "__main__":
    main()
