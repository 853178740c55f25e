"""PyTorch side of tests/e2e/llama_continue_training_test.cpp: the loss of a Hugging Face
LlamaForCausalLM directory on one batch, computed independently of the C++ backend.

The model is rebuilt in plain torch, in float64, from config.json and model.safetensors alone by
tests/backend/ckpt/pytorch_reference.py (read_safetensors, llama_loss: LlamaForCausalLM's
forward written from transformers' modeling_llama.py; transformers itself is not needed). The
loss is Megatron's lm loss with every position counted (no --eod-mask-loss): the mean over the
batch's tokens of cross_entropy(logits, labels).

Usage: /usr/bin/python3 llama_loss_reference.py <hf dir> <batch.json>
  batch.json: {"tokens": [[...], ...], "labels": [[...], ...]}, (batch, sequence) ids each.
Prints "loss <value>" (17 significant digits) and exits 0; exits 2 on bad input.
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "backend",
                                "ckpt"))
import torch  # noqa: E402
from pytorch_reference import llama_loss, read_safetensors  # noqa: E402


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    hf_dir, batch_path = sys.argv[1], sys.argv[2]
    with open(os.path.join(hf_dir, "config.json")) as f:
        config = json.load(f)
    if config.get("model_type") != "llama":
        print(f"{hf_dir}/config.json: model_type {config.get('model_type')!r}, not 'llama'")
        return 2
    parameters = read_safetensors(os.path.join(hf_dir, "model.safetensors"))
    with open(batch_path) as f:
        batch = json.load(f)
    tokens = torch.tensor(batch["tokens"], dtype=torch.long)
    labels = torch.tensor(batch["labels"], dtype=torch.long)
    if tokens.shape != labels.shape or tokens.dim() != 2:
        print(f"{batch_path}: tokens {tuple(tokens.shape)} and labels {tuple(labels.shape)} "
              "are not two (batch, sequence) arrays of one shape")
        return 2
    with torch.no_grad():
        loss = llama_loss(parameters, config, tokens, labels)
    print(f"loss {loss.item():.17g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
