"""The paper scaling model of docs/scaling.md: step time, communication and MFU of GPT training
per parallel layout, from stated FLOP rates and link bandwidths, and the tables that compare it
with Megatron-LM's published figures. Nothing here is measured. Standard library only.

  python3 tests/bench/scaling_model.py                     # prints the tables (markdown)
  python3 tests/bench/scaling_model.py --check docs/scaling.md
                                                           # fails if the doc's copy differs
"""
import argparse
import sys
from dataclasses import dataclass, replace

GPUS_PER_NODE = 8


@dataclass(frozen=True)
class Hardware:
    name: str
    peak: float      # dense bf16/fp16 FLOP/s per GPU (the MFU denominator)
    nvlink: float    # bytes/s per GPU and direction a ring attains inside a node
    network: float   # bytes/s per GPU and direction a ring attains across nodes


# H100 SXM: 989 TFLOP/s dense bf16; NVLink 4 450 GB/s per direction, one 400 Gb/s (50 GB/s)
# InfiniBand NIC per GPU. A100 SXM (Selene, Narayanan et al.): 312 TFLOP/s; NVLink 3 300 GB/s
# per direction, one 200 Gb/s (25 GB/s) HDR NIC per GPU. Rings are assumed to attain 80 % of
# NVLink and 90 % of the NIC (about what nccl-tests reports for large messages).
H100 = Hardware("H100", 989e12, 0.8 * 450e9, 0.9 * 50e9)
A100 = Hardware("A100", 312e12, 0.8 * 300e9, 0.9 * 25e9)


@dataclass(frozen=True)
class Model:
    layers: int
    hidden: int
    seq: int
    vocab: int
    recompute: bool = False  # full recompute: the layers' forward runs twice

    def parameters(self):
        # The matmul weights and the embedding (norms and biases are below 0.1 %).
        return 12 * self.layers * self.hidden ** 2 + self.vocab * self.hidden

    def model_flops(self, batch):
        """Per step of `batch` sequences: 6·N·tokens plus attention's 12·L·s²·h per sequence,
        72·B·s·L·h²·(1 + s/(6h) + V/(12·L·h)) (Narayanan et al. 2021 without recompute)."""
        L, h, s, V = self.layers, self.hidden, self.seq, self.vocab
        return 72 * batch * s * L * h * h * (1 + s / (6 * h) + V / (12 * L * h))

    def hardware_flops(self, batch):
        """What the GPUs execute: with full recompute one more forward of the layers, which makes
        Narayanan et al.'s 96·B·s·L·h²·(1 + s/(6h) + V/(16·L·h))."""
        L, h, s = self.layers, self.hidden, self.seq
        extra = 24 * batch * s * L * h * h * (1 + s / (6 * h)) if self.recompute else 0
        return self.model_flops(batch) + extra


@dataclass(frozen=True)
class Layout:
    tp: int = 1
    pp: int = 1
    dp: int = 1
    chunks: int = 1            # V, model chunks per pipeline stage (interleaved schedule)
    micro_batch: int = 1       # b
    zero: int = 1              # 0: all-reduce; 1: distributed optimizer; 3: ZeRO-3

    @property
    def gpus(self):
        return self.tp * self.pp * self.dp


@dataclass
class Step:
    micro_batches: int
    compute: float      # seconds of layer math, nothing waiting
    bubble: float       # fraction of `compute` the pipeline idles: (pp − 1)/(V·m)
    tp_bytes: float     # sent per GPU per step
    pp_bytes: float
    dp_bytes: float
    exposed_none: float     # communication seconds on the critical path, nothing overlapped
    exposed_overlap: float  # the same with Megatron's overlaps (see docs/scaling.md)
    model_flops: float
    hardware_flops: float


def ring_link(hw, group_span):
    """A group whose members lie within `group_span` consecutive ranks: NVLink when that fits in
    a node, else the network (every ring crossing nodes goes at the NIC's rate)."""
    return hw.nvlink if group_span <= GPUS_PER_NODE else hw.network


def step(model, layout, hw, batch, throughput):
    t, p, d, v, b = layout.tp, layout.pp, layout.dp, layout.chunks, layout.micro_batch
    if batch % (d * b) != 0:
        raise ValueError(f"batch {batch} does not split into micro batches of {b} over dp {d}")
    m = batch // (d * b)
    n = layout.gpus
    F_model = model.model_flops(batch)
    F_hw = model.hardware_flops(batch)
    compute = F_hw / n / throughput
    per_micro_batch = compute / m
    backward_share = 0.75 if model.recompute else 2 / 3  # recompute forward + backward of 4
    bubble = (p - 1) / (v * m)

    h, s = model.hidden, model.seq
    activation = b * s * h * 2  # one micro batch's hidden states in bf16
    # Tensor parallel: 4 all-reduces of the activation per layer and micro batch (2 forward,
    # 2 backward; with full recompute 2 more), 2·(t − 1)/t of it sent each, ring. Sequence
    # parallelism replaces each by an all-gather and a reduce-scatter: the same bytes.
    tp_collectives = 6 if model.recompute else 4
    tp_bytes = m * (model.layers / p) * tp_collectives * 2 * (t - 1) / t * activation
    tp_time = tp_bytes / ring_link(hw, t)
    # Pipeline: each chunk boundary sends the activation forward and receives its gradient,
    # 1/t of it per GPU (Megatron's scatter/gather across the tensor-parallel ranks).
    pp_bytes = 0.0 if p == 1 else 2 * v * m * activation / t
    pp_time = pp_bytes / ring_link(hw, t * p)
    # Data parallel, over each GPU's Ψ/(t·p) parameters: fp32 gradients (Megatron reduces bf16
    # training's gradients in fp32), bf16 parameters.
    shard = model.parameters() / (t * p)
    dp_link = ring_link(hw, n)
    ring = (d - 1) / d
    if layout.zero == 0:      # all-reduce of the gradients
        reduce, gather = 2 * ring * 4 * shard, 0.0
    elif layout.zero == 1:    # reduce-scatter of the gradients, all-gather of the parameters
        reduce, gather = ring * 4 * shard, ring * 2 * shard
    else:                     # ZeRO-3 (DeepSpeed): per micro batch, parameters gathered for
        reduce = m * ring * 2 * shard        # the forward and again for the backward, bf16
        gather = m * 2 * ring * 2 * shard    # gradients reduce-scattered
    dp_bytes = reduce + gather
    reduce_time, gather_time = reduce / dp_link, gather / dp_link
    exposed_none = tp_time + pp_time + reduce_time + gather_time
    # Overlapped: TP (--tp-comm-overlap) and the p2p transfers hidden; the gradient reduction
    # overlaps the last micro batch's backward, the parameter gather the first one's forward
    # (--overlap-grad-reduce, --overlap-param-gather); ZeRO-3 prefetches each micro batch's
    # gathers under its compute.
    if layout.zero == 3:
        exposed_overlap = m * max(0.0, (reduce_time + gather_time) / m - per_micro_batch)
    else:
        exposed_overlap = (max(0.0, reduce_time - backward_share * per_micro_batch) +
                           max(0.0, gather_time - (1 - backward_share) * per_micro_batch))
    return Step(m, compute, bubble, tp_bytes, pp_bytes, dp_bytes, exposed_none,
                exposed_overlap, F_model, F_hw)


def utilization(result, layout, hw, overlapped, hardware=False):
    """MFU (or, with `hardware`, the share of peak the executed FLOPs reach)."""
    exposed = result.exposed_overlap if overlapped else result.exposed_none
    seconds = result.compute * (1 + result.bubble) + exposed
    flops = result.hardware_flops if hardware else result.model_flops
    return flops / (layout.gpus * hw.peak * seconds)


def calibrate(model, layout, hw, batch, target, overlapped=True, hardware=False):
    """The per-GPU throughput at which the model reproduces `target` (bisection: utilization
    grows with the throughput)."""
    low, high = 1e12, hw.peak
    for _ in range(100):
        mid = (low + high) / 2
        value = utilization(step(model, layout, hw, batch, mid), layout, hw, overlapped, hardware)
        low, high = (mid, high) if value < target else (low, mid)
    return (low + high) / 2


def pct(x):
    return f"{100 * x:.1f} %"


def gb(x):
    return f"{x / 1e9:.1f}" if x >= 0.05e9 else ("0" if x == 0 else f"{x / 1e9:.2f}")


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


# --- the published figures (paper figures, not measurements of ours) ---------------------------

# Megatron-LM README, "Weak Scaling Results" (images/model_table.png, Megatron-Core r0.8.0):
# H100, vocabulary 131,072, sequence 4,096; (name, heads, hidden, layers, tp, pp, dp, GPUs, batch,
# per-GPU TFLOP/s, MFU).
MEGATRON_H100 = [
    ("1.7B", 16, 2048, 24, 1, 1, 48, 48, 192, 408.8, 0.41),
    ("7.1B", 32, 4096, 30, 2, 1, 48, 96, 192, 465.9, 0.47),
    ("16B", 48, 6144, 32, 4, 1, 48, 192, 192, 489.1, 0.49),
    ("32B", 56, 7168, 48, 8, 1, 48, 384, 192, 459.6, 0.46),
    ("70B", 64, 8192, 84, 8, 2, 48, 768, 384, 419.7, 0.42),
    ("119B", 80, 10240, 92, 8, 4, 48, 1536, 768, 420.5, 0.43),
    ("177B", 96, 12288, 96, 8, 6, 48, 2304, 1152, 432.8, 0.44),
    ("314B", 128, 16384, 96, 8, 8, 48, 3072, 1536, 474.4, 0.48),
    ("462B", 144, 18432, 112, 8, 16, 48, 6144, 3072, 459.9, 0.47),
]
# Megatron-LM README, "Strong Scaling Results": the 177B model, batch 1,152, from 96 to 4,608
# H100s, MFU 47 % → 42 % (and 44 % at 2,304 in the table above, the same model and batch).
STRONG_177B = [(96, 0.47), (2304, 0.44), (4608, 0.42)]
# Narayanan et al. 2021, Table 1 (also in the Megatron-LM README until 2024,
# images/cases_april2021.png):
# A100, vocabulary 51,200, sequence 2,048, activation recompute; (name, hidden, layers, tp, pp,
# GPUs, batch, per-GPU TFLOP/s, share of the 312 TFLOP/s peak). The paper's t and p per row.
NARAYANAN_A100 = [
    ("1.7B", 2304, 24, 1, 1, 32, 512, 137, 0.44),
    ("3.6B", 3072, 30, 2, 1, 64, 512, 138, 0.44),
    ("7.5B", 4096, 36, 4, 1, 128, 512, 142, 0.46),
    ("18B", 6144, 40, 8, 1, 256, 1024, 135, 0.43),
    ("39B", 8192, 48, 8, 2, 512, 1536, 138, 0.44),
    ("76B", 10240, 60, 8, 4, 1024, 1792, 140, 0.45),
    ("145B", 12288, 80, 8, 8, 1536, 2304, 148, 0.47),
    ("310B", 16384, 96, 8, 16, 1920, 2160, 155, 0.50),
    ("530B", 20480, 105, 8, 35, 2520, 2520, 163, 0.52),
    ("1T", 25600, 128, 8, 64, 3072, 3072, 163, 0.52),
]
# The README's GPT-3 example: 175B (96 × 12288), t 8, p 16 on 1,024 A100s, batch 1,536, about
# 32 s per step, 138 TFLOP/s per GPU, 44 % of peak.
# Megatron-LM of 2021 had no distributed optimizer: data parallelism all-reduced the gradients.
GPT3_A100 = (Model(96, 12288, 2048, 51200, recompute=True), Layout(tp=8, pp=16, dp=8, zero=0),
             1536, 0.44)


def h100_anchor():
    """The H100 throughput that reproduces the 177B model's 47 % on 96 GPUs (tp 8, pp 6, dp 2)."""
    model = Model(96, 12288, 4096, 131072)
    return calibrate(model, Layout(tp=8, pp=6, dp=2), H100, 1152, 0.47)


def projection_table(x):
    """Weak scaling 8 → 1,024 H100s of a 7B GPT (32 × 4096, s 2048, V 51,200), 4 sequences per
    GPU per step, micro batch 1, per layout."""
    model = Model(32, 4096, 2048, 51200)
    layouts = [
        ("DP (all-reduce)", dict(zero=0)),
        ("DP + ZeRO-1", dict(zero=1)),
        ("DP + ZeRO-3", dict(zero=3)),
        ("TP 8 + DP", dict(tp=8, zero=1)),
        ("PP 4 1F1B + DP", dict(pp=4, zero=1)),
        ("PP 4 interleaved V 2 + DP", dict(pp=4, chunks=2, zero=1)),
    ]
    rows = []
    for name, options in layouts:
        for gpus in (8, 64, 256, 1024):
            base = Layout(**options)
            layout = replace(base, dp=gpus // (base.tp * base.pp))
            batch = 4 * gpus
            r = step(model, layout, H100, batch, x)
            rows.append([name, gpus, layout.dp, r.micro_batches, pct(r.bubble), gb(r.tp_bytes),
                         gb(r.pp_bytes), gb(r.dp_bytes), f"{1e3 * r.compute:.0f}",
                         f"{1e3 * r.exposed_none:.0f}", f"{1e3 * r.exposed_overlap:.0f}",
                         pct(utilization(r, layout, H100, False)),
                         pct(utilization(r, layout, H100, True))])
    return table(["layout", "GPUs", "dp", "m", "bubble", "TP GB", "PP GB", "DP GB", "compute ms",
                  "exposed ms, none", "exposed ms, overlap", "MFU, none", "MFU, overlap"], rows)


def exposed_share(result, overlapped=True):
    """The exposed communication's share of the step."""
    exposed = result.exposed_overlap if overlapped else result.exposed_none
    return exposed / (result.compute * (1 + result.bubble) + exposed)


def h100_weak_table(x):
    rows = []
    for name, heads, h, L, t, p, d, gpus, batch, tflops, mfu in MEGATRON_H100:
        model = Model(L, h, 4096, 131072)
        layout = Layout(tp=t, pp=p, dp=d)
        r = step(model, layout, H100, batch, x)
        implied = calibrate(model, layout, H100, batch, mfu)
        rows.append([name, f"{t} × {p} × {d}", r.micro_batches, pct(r.bubble),
                     pct(exposed_share(r)), pct(mfu), pct(utilization(r, layout, H100, True)),
                     pct(utilization(r, layout, H100, False)), f"{implied / 1e12:.0f}"])
    return table(["model", "tp × pp × dp", "m", "bubble (V 1)", "exposed comm, overlap",
                  "published MFU", "model, overlap", "model, none", "implied TFLOP/s"], rows)


def h100_strong_table(x):
    model = Model(96, 12288, 4096, 131072)
    rows = []
    for gpus, mfu in STRONG_177B:
        row = [gpus, gpus // 48, 1152 // (gpus // 48), pct(mfu)]
        for chunks in (1, 2, 4):
            layout = Layout(tp=8, pp=6, dp=gpus // 48, chunks=chunks)
            r = step(model, layout, H100, 1152, x)
            row.append(f"{pct(utilization(r, layout, H100, True))} ({pct(r.bubble)})")
        rows.append(row)
    return table(["GPUs", "dp", "m", "published MFU", "model V 1 (bubble)", "model V 2 (bubble)",
                  "model V 4 (bubble)"], rows)


def a100_table():
    model, layout, batch, share = GPT3_A100
    x = calibrate(model, layout, A100, batch, share, hardware=True)
    entries = [("175B (anchor)", model, layout, batch, share)]
    for name, h, L, t, p, gpus, batch, tflops, share in NARAYANAN_A100:
        entries.append((name, Model(L, h, 2048, 51200, recompute=True),
                        Layout(tp=t, pp=p, dp=gpus // (t * p), zero=0), batch, share))
    rows = []
    for name, model, layout, batch, share in entries:
        r = step(model, layout, A100, batch, x)
        seconds = r.compute * (1 + r.bubble) + r.exposed_overlap
        implied = calibrate(model, layout, A100, batch, share, hardware=True)
        # The step the published share of peak means, for the executed (recompute) FLOPs.
        published = r.hardware_flops / (layout.gpus * A100.peak * share)
        rows.append([name, f"{layout.tp} × {layout.pp} × {layout.dp}", r.micro_batches,
                     pct(r.bubble), pct(exposed_share(r)), pct(share),
                     pct(utilization(r, layout, A100, True, hardware=True)),
                     f"{published:.1f} s", f"{seconds:.1f} s", f"{implied / 1e12:.0f}"])
    return x, table(["model", "tp × pp × dp", "m", "bubble (V 1)", "exposed comm, overlap",
                     "published, of peak", "model, overlap", "published step", "model step",
                     "implied TFLOP/s"], rows)


def render():
    x = h100_anchor()
    x_a100, a100 = a100_table()
    sections = [
        f"<!-- scaling_model.py: H100 throughput {x / 1e12:.0f} TFLOP/s (anchor: 177B, 96 GPUs, "
        f"47 %); A100 {x_a100 / 1e12:.0f} TFLOP/s (anchor: GPT-3 175B, 1,024 GPUs, 44 %) -->",
        projection_table(x),
        h100_weak_table(x),
        h100_strong_table(x),
        a100,
    ]
    return sections


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", metavar="DOC",
                        help="fail unless DOC holds every table as printed")
    arguments = parser.parse_args()
    sections = render()
    if arguments.check:
        with open(arguments.check, encoding="utf-8") as f:
            doc = f.read()
        missing = [s for s in sections if s not in doc]
        for s in missing:
            print(f"{arguments.check} lacks, or has another version of:\n{s}\n", file=sys.stderr)
        if missing:
            print("regenerate with: python3 tests/bench/scaling_model.py", file=sys.stderr)
            return 1
        print(f"{arguments.check}: all {len(sections)} tables match")
        return 0
    print("\n\n".join(sections))
    return 0


if __name__ == "__main__":
    sys.exit(main())
