"""Writes a tiny Hugging Face LlamaForCausalLM directory the way transformers' save_pretrained
lays one out, without transformers: config.json with LlamaConfig's keys (no key of ours such as
tokenizer_vocab_size: vocab_size is the tokenizer's size, as in Llama 2's 32000) and
model.safetensors (F32, transformers' tensor names, "__metadata__": {"format": "pt"}, the
header padded with spaces to a multiple of 8 bytes, tensors in name order), written from the
safetensors format description. For tests/e2e/llama_continue_training_test.cpp: a starting
model that our exporter did not write.

Weights: normal(0, 0.02) for the matrices, 1 + normal(0, 0.1) for the RMSNorm weights (so that
they matter), from torch.Generator seeded with SEED.

Usage: /usr/bin/python3 write_llama_hf.py <dir> <vocab size> <seed>
Shape: 2 layers, hidden 64, intermediate 128, 4 heads, 2 key/value heads, untied lm_head.
"""
import json
import os
import struct
import sys

import torch

HIDDEN, INTERMEDIATE, HEADS, KV_HEADS, LAYERS = 64, 128, 4, 2, 2


def main():
    if len(sys.argv) != 4:
        print(__doc__)
        return 2
    directory, vocab, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    os.makedirs(directory, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    head_dim = HIDDEN // HEADS

    def matrix(rows, columns):
        return torch.randn(rows, columns, generator=generator) * 0.02

    def norm():
        return 1.0 + torch.randn(HIDDEN, generator=generator) * 0.1

    tensors = {"model.embed_tokens.weight": matrix(vocab, HIDDEN),
               "model.norm.weight": norm(),
               "lm_head.weight": matrix(vocab, HIDDEN)}
    for i in range(LAYERS):
        h = f"model.layers.{i}."
        tensors[h + "input_layernorm.weight"] = norm()
        tensors[h + "post_attention_layernorm.weight"] = norm()
        tensors[h + "self_attn.q_proj.weight"] = matrix(HEADS * head_dim, HIDDEN)
        tensors[h + "self_attn.k_proj.weight"] = matrix(KV_HEADS * head_dim, HIDDEN)
        tensors[h + "self_attn.v_proj.weight"] = matrix(KV_HEADS * head_dim, HIDDEN)
        tensors[h + "self_attn.o_proj.weight"] = matrix(HIDDEN, HEADS * head_dim)
        tensors[h + "mlp.gate_proj.weight"] = matrix(INTERMEDIATE, HIDDEN)
        tensors[h + "mlp.up_proj.weight"] = matrix(INTERMEDIATE, HIDDEN)
        tensors[h + "mlp.down_proj.weight"] = matrix(HIDDEN, INTERMEDIATE)

    header = {"__metadata__": {"format": "pt"}}
    body = bytearray()
    for name in sorted(tensors):
        data = tensors[name].to(torch.float32).contiguous().numpy().astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(tensors[name].shape),
                        "data_offsets": [len(body), len(body) + len(data)]}
        body += data
    header_bytes = json.dumps(header, separators=(",", ":")).encode()
    header_bytes += b" " * (-len(header_bytes) % 8)
    with open(os.path.join(directory, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(header_bytes)) + header_bytes + body)

    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
        "hidden_act": "silu", "hidden_size": HIDDEN, "initializer_range": 0.02,
        "intermediate_size": INTERMEDIATE, "max_position_embeddings": 64, "mlp_bias": False,
        "num_attention_heads": HEADS, "num_hidden_layers": LAYERS,
        "num_key_value_heads": KV_HEADS, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
        "rope_scaling": None, "rope_theta": 10000.0, "tie_word_embeddings": False,
        "torch_dtype": "float32", "transformers_version": "4.40.0", "use_cache": True,
        "vocab_size": vocab}
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    print(f"wrote {directory}: LlamaForCausalLM, {len(tensors)} tensors, vocab {vocab}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
