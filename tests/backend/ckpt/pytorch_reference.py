"""PyTorch side of the parity test (tests/backend/ckpt/pytorch_parity_test.cpp).

The C++ test trains a tiny GptModel for a few steps and leaves in <dir>:
  initial/config.json, initial/model.safetensors   the initial weights, exported to Hugging Face
  gradients.safetensors                            the gradients of step 1, under the same names
  final/model.safetensors                          the weights after the last step
  run.json                                         the batches, our losses, learning rates and
                                                   gradient norms, and the optimizer settings
This script rebuilds the model in plain torch from the Hugging Face names and config.json alone
(GPT2LMHeadModel or LlamaForCausalLM semantics, written here from transformers' modeling code;
the transformers package is not needed), in float64, and replays the run with torch's own
AdamW and clip_grad_norm_ and Megatron's learning-rate formula (OptimizerParamScheduler.get_lr).
It checks, as relative errors ||ours - torch|| / ||torch|| per tensor:
  losses of every step < 1e-5, step-1 gradients of every tensor < 1e-4,
  gradient norms < 1e-4, learning rates < 1e-12, final weights of every tensor < 1e-4
  (GPT-2's key biases apart: see check_key_biases),
prints the worst of each, and exits 0 when all hold, 1 when one does not, 2 on bad input.

Usage: /usr/bin/python3 pytorch_reference.py <dir>
"""
import json
import math
import struct
import sys

import torch
import torch.nn.functional as F

LOSS_TOLERANCE = 1e-5
GRADIENT_TOLERANCE = 1e-4
WEIGHT_TOLERANCE = 1e-4
LEARNING_RATE_TOLERANCE = 1e-12

DTYPES = {"F32": torch.float32, "F64": torch.float64, "F16": torch.float16, "BF16": torch.bfloat16}


def read_safetensors(path):
    """name -> float64 tensor, from the format's description (8-byte header length, JSON, data)."""
    with open(path, "rb") as f:
        data = f.read()
    (header_length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + header_length])
    header.pop("__metadata__", None)
    body = bytearray(data[8 + header_length:])
    tensors = {}
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        dtype = DTYPES[entry["dtype"]]
        if end == begin:
            values = torch.zeros(0, dtype=dtype)
        else:
            element_size = torch.empty(0, dtype=dtype).element_size()
            values = torch.frombuffer(body, dtype=dtype, count=(end - begin) // element_size,
                                      offset=begin)
        tensors[name] = values.reshape(entry["shape"]).to(torch.float64).clone()
    return tensors


def layer_norm(x, weight, bias, eps):
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def rms_norm(x, weight, eps):
    # LlamaRMSNorm: x / sqrt(mean(x^2) + eps) * weight
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def causal_attention(q, k, v):
    """q: (B, NH, T, HD); k, v: (B, NH, T, HD). Softmax(q k^T / sqrt(HD)) v, causal."""
    T = q.shape[2]
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def gpt2_loss(p, config, tokens, labels):
    """GPT2LMHeadModel (modeling_gpt2.py): learned positions, Conv1D weights (in, out), c_attn
    output split into [q | k | v] of width n_embd, gelu_new, lm_head tied to wte."""
    C, NH, eps = config["n_embd"], config["n_head"], config["layer_norm_epsilon"]
    B, T = tokens.shape
    x = p["transformer.wte.weight"][tokens] + p["transformer.wpe.weight"][torch.arange(T)]
    for i in range(config["n_layer"]):
        h = f"transformer.h.{i}."
        a = layer_norm(x, p[h + "ln_1.weight"], p[h + "ln_1.bias"], eps)
        qkv = a @ p[h + "attn.c_attn.weight"] + p[h + "attn.c_attn.bias"]
        q, k, v = (t.view(B, T, NH, C // NH).transpose(1, 2) for t in qkv.split(C, dim=2))
        context = causal_attention(q, k, v).transpose(1, 2).reshape(B, T, C)
        x = x + context @ p[h + "attn.c_proj.weight"] + p[h + "attn.c_proj.bias"]
        m = layer_norm(x, p[h + "ln_2.weight"], p[h + "ln_2.bias"], eps)
        m = F.gelu(m @ p[h + "mlp.c_fc.weight"] + p[h + "mlp.c_fc.bias"], approximate="tanh")
        x = x + m @ p[h + "mlp.c_proj.weight"] + p[h + "mlp.c_proj.bias"]
    x = layer_norm(x, p["transformer.ln_f.weight"], p["transformer.ln_f.bias"], eps)
    logits = x @ p["transformer.wte.weight"].t()
    return F.cross_entropy(logits.reshape(B * T, -1), labels.reshape(-1))


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def linear(p, name, x):
    """torch.nn.Linear as LlamaForCausalLM's: weight (out, in), a bias only where one is saved
    (attention_bias / mlp_bias)."""
    y = x @ p[name + ".weight"].t()
    return y + p[name + ".bias"] if name + ".bias" in p else y


def llama3_inverse_frequencies(inv_freq, scaling):
    """rope_scaling with rope_type llama3 (transformers' _compute_llama3_parameters): wavelengths
    below original / high_freq_factor keep their frequency, those above original /
    low_freq_factor are divided by factor, those between are interpolated."""
    factor, low = scaling["factor"], scaling["low_freq_factor"]
    high, original = scaling["high_freq_factor"], scaling["original_max_position_embeddings"]
    wavelength = 2 * math.pi / inv_freq
    scaled = torch.where(wavelength > original / low, inv_freq / factor, inv_freq)
    smooth = (original / wavelength - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelength < original / high) & ~(wavelength > original / low)
    return torch.where(medium, smoothed, scaled)


def llama_loss(p, config, tokens, labels):
    """LlamaForCausalLM (modeling_llama.py): RMSNorm, rotary embeddings in the rotate_half form,
    grouped-query attention (kv head g serves query heads g·NH/NKV .. (g+1)·NH/NKV - 1), SwiGLU
    MLP down(silu(gate(x)) · up(x)), lm_head tied to embed_tokens unless it is saved; Llama 3's
    rope_scaling when config.json has one."""
    C, NH = config["hidden_size"], config["num_attention_heads"]
    NKV = config.get("num_key_value_heads") or NH
    HD = C // NH
    eps, theta = config["rms_norm_eps"], config.get("rope_theta", 10000.0)
    B, T = tokens.shape
    inv_freq = 1.0 / (theta ** (torch.arange(0, HD, 2, dtype=torch.float64) / HD))
    scaling = config.get("rope_scaling")
    if scaling is not None:
        if scaling.get("rope_type", scaling.get("type")) != "llama3":
            raise ValueError(f"rope_scaling {scaling}: only llama3 is written here")
        inv_freq = llama3_inverse_frequencies(inv_freq, scaling)
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    x = p["model.embed_tokens.weight"][tokens]
    for i in range(config["num_hidden_layers"]):
        h = f"model.layers.{i}."
        a = rms_norm(x, p[h + "input_layernorm.weight"], eps)
        q = linear(p, h + "self_attn.q_proj", a).view(B, T, NH, HD).transpose(1, 2)
        k = linear(p, h + "self_attn.k_proj", a).view(B, T, NKV, HD).transpose(1, 2)
        v = linear(p, h + "self_attn.v_proj", a).view(B, T, NKV, HD).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(NH // NKV, dim=1)
        v = v.repeat_interleave(NH // NKV, dim=1)
        context = causal_attention(q, k, v).transpose(1, 2).reshape(B, T, C)
        x = x + linear(p, h + "self_attn.o_proj", context)
        m = rms_norm(x, p[h + "post_attention_layernorm.weight"], eps)
        gated = F.silu(linear(p, h + "mlp.gate_proj", m)) * linear(p, h + "mlp.up_proj", m)
        x = x + linear(p, h + "mlp.down_proj", gated)
    x = rms_norm(x, p["model.norm.weight"], eps)
    output = p["lm_head.weight"] if "lm_head.weight" in p else p["model.embed_tokens.weight"]
    logits = x @ output.t()
    return F.cross_entropy(logits.reshape(B * T, -1), labels.reshape(-1))


def megatron_learning_rate(schedule, num_steps):
    """OptimizerParamScheduler.get_lr (megatron/core/optimizer_param_scheduler.py)."""
    max_lr, min_lr = schedule["max_lr"], schedule["min_lr"]
    warmup, decay = schedule["warmup_steps"], schedule["decay_steps"]
    if warmup > 0 and num_steps <= warmup:
        return schedule["init_lr"] + (max_lr - schedule["init_lr"]) * num_steps / warmup
    if schedule["decay_style"] == "constant":
        return max_lr
    if num_steps > decay:
        return min_lr
    ratio = (num_steps - warmup) / (decay - warmup)
    if schedule["decay_style"] == "linear":
        coefficient = 1.0 - ratio
    elif schedule["decay_style"] == "cosine":
        coefficient = 0.5 * (math.cos(math.pi * ratio) + 1.0)
    else:
        raise ValueError(f"decay_style {schedule['decay_style']}")
    return min_lr + coefficient * (max_lr - min_lr)


def relative_error(ours, reference):
    ours = torch.as_tensor(ours, dtype=torch.float64)
    reference = torch.as_tensor(reference, dtype=torch.float64)
    difference = (ours - reference).norm().item()
    scale = reference.norm().item()
    if scale == 0.0:
        return 0.0 if difference == 0.0 else math.inf
    return difference / scale


class Worst:
    """The largest relative error of one kind of quantity and where it occurred."""

    def __init__(self, what, tolerance):
        self.what, self.tolerance, self.error, self.where = what, tolerance, 0.0, "-"

    def add(self, error, where):
        if not error <= self.error:  # also takes NaN
            self.error, self.where = error, where

    def report(self):
        ok = self.error < self.tolerance
        print(f"{self.what}: worst relative error {self.error:.3e} at {self.where} "
              f"(tolerance {self.tolerance:.0e}) {'ok' if ok else 'FAILED'}", flush=True)
        return ok


def compare_tensors(worst, ours, reference, label):
    names = set(ours) | set(reference)
    for name in sorted(names):
        if name not in ours or name not in reference:
            print(f"{label}: tensor {name} is only on {'our' if name in ours else 'the torch'} side")
            worst.add(math.inf, name)
            continue
        if tuple(ours[name].shape) != tuple(reference[name].shape):
            print(f"{label}: tensor {name} has shape {tuple(ours[name].shape)} here, "
                  f"{tuple(reference[name].shape)} in torch")
            worst.add(math.inf, name)
            continue
        worst.add(relative_error(ours[name], reference[name]), name)


def check_key_biases(ours, reference, hidden, learning_rate_sum):
    """Takes the key third out of every GPT-2 c_attn.bias (in place, on both sides) and checks
    it on its own. Its gradient is zero in exact arithmetic: adding a bias b to every key adds
    q_i . b to a whole row of scores, which the softmax ignores. So on each side it holds only
    rounding noise (about 1e-11 in float32, 1e-17 in float64), which AdamW turns into steps of
    up to lr . |g| / (|g| + eps); a relative error against float64's near-zero values measures
    that noise, not the implementation. What is checked instead: it has no effect on the loss
    (the losses above) and it moved less than the sum of the learning rates."""
    worst = 0.0
    for name in sorted(reference):
        if not name.endswith("attn.c_attn.bias"):
            continue
        ours_key, reference_key = ours[name][hidden:2 * hidden], reference[name][hidden:2 * hidden]
        worst = max(worst, (ours_key - reference_key).abs().max().item())
        for tensors in (ours, reference):
            tensors[name] = torch.cat((tensors[name][:hidden], tensors[name][2 * hidden:]))
    ok = worst < learning_rate_sum
    print(f"final key biases (zero gradient in exact arithmetic, compared apart): largest "
          f"difference {worst:.3e}, bound {learning_rate_sum:.3e} {'ok' if ok else 'FAILED'}")
    return ok


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    directory = sys.argv[1]
    torch.set_num_threads(1)
    with open(f"{directory}/initial/config.json") as f:
        config = json.load(f)
    with open(f"{directory}/run.json") as f:
        run = json.load(f)
    loss_function = {"gpt2": gpt2_loss, "llama": llama_loss}.get(config.get("model_type"))
    if loss_function is None:
        print(f"model_type {config.get('model_type')!r} is not one this reference builds")
        return 2

    parameters = read_safetensors(f"{directory}/initial/model.safetensors")
    for tensor in parameters.values():
        tensor.requires_grad_(True)
    print(f"torch {torch.__version__}: {config['model_type']} with "
          f"{sum(t.numel() for t in parameters.values())} parameters in {len(parameters)} tensors, "
          f"{len(run['steps'])} steps", flush=True)

    # Megatron's parameter groups: no weight decay for biases and norm weights (the 1-D tensors).
    optimizer_settings = run["optimizer"]
    decayed = [t for t in parameters.values() if t.dim() > 1]
    not_decayed = [t for t in parameters.values() if t.dim() <= 1]
    optimizer = torch.optim.AdamW(
        [{"params": decayed, "weight_decay": optimizer_settings["weight_decay"]},
         {"params": not_decayed, "weight_decay": 0.0}],
        lr=0.0, betas=(optimizer_settings["beta1"], optimizer_settings["beta2"]),
        eps=optimizer_settings["eps"])

    loss_worst = Worst("loss", LOSS_TOLERANCE)
    gradient_worst = Worst("step-1 gradients", GRADIENT_TOLERANCE)
    norm_worst = Worst("gradient norms", GRADIENT_TOLERANCE)
    rate_worst = Worst("learning rates", LEARNING_RATE_TOLERANCE)
    weight_worst = Worst("final weights", WEIGHT_TOLERANCE)
    shape = (run["batch_size"], run["seq_length"])
    num_steps = 0
    for index, step in enumerate(run["steps"], start=1):
        tokens = torch.tensor(step["tokens"], dtype=torch.int64).view(shape)
        labels = torch.tensor(step["labels"], dtype=torch.int64).view(shape)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_function(parameters, config, tokens, labels)
        loss.backward()
        loss_worst.add(relative_error(step["loss"], loss.item()), f"step {index}")
        if index == 1:
            ours = read_safetensors(f"{directory}/gradients.safetensors")
            compare_tensors(gradient_worst, ours,
                            {name: t.grad for name, t in parameters.items()}, "gradients")
        norm = torch.nn.utils.clip_grad_norm_(list(parameters.values()), run["clip_grad"]).item()
        norm_worst.add(relative_error(step["grad_norm"], norm), f"step {index}")
        learning_rate = megatron_learning_rate(run["schedule"], num_steps)
        rate_worst.add(relative_error(step["learning_rate"], learning_rate), f"step {index}")
        for group in optimizer.param_groups:
            group["lr"] = learning_rate
        optimizer.step()
        num_steps += run["global_batch_size"]
        print(f"step {index}: loss torch {loss.item():.9f} ours {step['loss']:.9f} | grad norm "
              f"torch {norm:.6f} ours {step['grad_norm']:.6f} | lr {learning_rate:.6e}", flush=True)

    final = read_safetensors(f"{directory}/final/model.safetensors")
    reference = {name: t.detach() for name, t in parameters.items()}
    key_bias_ok = True
    if config["model_type"] == "gpt2":
        key_bias_ok = check_key_biases(final, reference, config["n_embd"],
                                       sum(step["learning_rate"] for step in run["steps"]))
    compare_tensors(weight_worst, final, reference, "final weights")
    results = [w.report() for w in (loss_worst, gradient_worst, norm_worst, rate_worst, weight_worst)]
    results.append(key_bias_ok)
    if all(results):
        print("parity: all within tolerance", flush=True)
        return 0
    print("parity: FAILED", flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
