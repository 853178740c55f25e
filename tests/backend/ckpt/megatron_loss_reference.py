"""PyTorch side of megatron_checkpoint_writer_test.cpp: the loss of a Megatron-LM GPT
checkpoint file of one rank (TP=1, PP=1) on one batch, computed in float64 from the file alone.

The file is loaded as load_torch_checkpoint.py loads it (PyTorch's weights_only globals and
argparse.Namespace only). The forward is Megatron core's GPTModel written out in plain torch:
the word and learned position embeddings, per layer a pre-norm attention block (LayerNorm or
RMSNorm; the fused QKV rows per query group: that group's query heads, then its key head, then
its value head; causal softmax(q k^T / sqrt(d)) v; linear_proj) and a pre-norm MLP (linear_fc1,
GELU's tanh form, linear_fc2), the final norm and the output layer (output_layer.weight, or the
word embeddings when tied). Both of core's namings are read: the local spec's norms, or
Transformer Engine's fused into linear_qkv and linear_fc1 (layer_norm_weight/_bias). The loss is
Megatron's lm loss with every position counted: the mean over the batch of cross_entropy over
the padded vocabulary.

FILE may also be a torch_dist checkpoint's iteration directory (metadata.json, common.pt, the
DCP files): its common.pt is loaded as above, and the model's tensors whole, by PyTorch's own
distributed-checkpoint reader (torch_distributed_checkpoint.py: load_state_dict without a
process group) at their global shapes; the layers stacked under decoder.layers.<name> are split
into decoder.layers.<N>.<name>. Any saved tensor- and pipeline-parallel size is read.

Usage: /usr/bin/python3 megatron_loss_reference.py FILE|DIR batch.json
  batch.json: {"tokens": [[...], ...], "labels": [[...], ...]}, (batch, sequence) ids each.
Prints "loss <value>" (17 significant digits) and exits 0; exits 2 on what it does not build.
"""
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from load_torch_checkpoint import load  # noqa: E402
from pytorch_reference import causal_attention, layer_norm, rms_norm  # noqa: E402

TRANSFORMER_ENGINE_NORMS = {
    "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
    "self_attention.linear_qkv.layer_norm_bias": "input_layernorm.bias",
    "mlp.linear_fc1.layer_norm_weight": "pre_mlp_layernorm.weight",
    "mlp.linear_fc1.layer_norm_bias": "pre_mlp_layernorm.bias",
}


def local_spec_names(model):
    """The model's tensors in float64 under the local spec's names."""
    tensors = {}
    for name, value in model.items():
        if not isinstance(value, torch.Tensor):
            continue  # _extra_state
        for fused, norm in TRANSFORMER_ENGINE_NORMS.items():
            name = name.replace(fused, norm)
        tensors[name] = value.to(torch.float64)
    return tensors


def load_torch_dist(directory):
    """common.pt, and the model's tensors of the distributed checkpoint by core's names."""
    from torch_distributed_checkpoint import CheckpointReader, load_state_dict
    common, _ = load(os.path.join(directory, "common.pt"))
    metadata = CheckpointReader(directory).read_metadata()
    state = {}
    for key, item in metadata.state_dict_metadata.items():
        if key.startswith("optimizer.") or not hasattr(item, "size"):
            continue
        state[key] = torch.empty(tuple(item.size), dtype=item.properties.dtype)
    load_state_dict(state, CheckpointReader(directory), no_dist=True)
    model = {}
    layers = "decoder.layers."
    for key, tensor in state.items():
        if key.startswith(layers) and not key[len(layers)].isdigit():
            for layer in range(tensor.shape[0]):
                model[f"{layers}{layer}.{key[len(layers):]}"] = tensor[layer]
        else:
            model[key] = tensor
    common["model"] = model
    return common


def megatron_gpt_loss(p, args, tokens, labels):
    heads = args.num_attention_heads
    groups = args.num_query_groups if args.group_query_attention else heads
    hidden = args.hidden_size
    head_dim = hidden // heads
    per_group = heads // groups
    eps = getattr(args, "norm_epsilon", getattr(args, "layernorm_epsilon", 1e-5))
    rms = args.normalization == "RMSNorm"

    def norm(x, prefix):
        if rms:
            return rms_norm(x, p[prefix + ".weight"], eps)
        return layer_norm(x, p[prefix + ".weight"], p[prefix + ".bias"], eps)

    def linear(x, prefix):
        y = x @ p[prefix + ".weight"].t()
        return y + p[prefix + ".bias"] if prefix + ".bias" in p else y

    batch, length = tokens.shape
    x = p["embedding.word_embeddings.weight"][tokens]
    if "embedding.position_embeddings.weight" in p:
        x = x + p["embedding.position_embeddings.weight"][torch.arange(length)]
    for layer in range(args.num_layers):
        h = f"decoder.layers.{layer}."
        qkv = linear(norm(x, h + "input_layernorm"), h + "self_attention.linear_qkv")
        qkv = qkv.view(batch, length, groups, (per_group + 2) * head_dim)
        q = qkv[..., : per_group * head_dim].reshape(batch, length, heads, head_dim)
        k = qkv[..., per_group * head_dim: (per_group + 1) * head_dim]
        v = qkv[..., (per_group + 1) * head_dim:]
        k = k.repeat_interleave(per_group, dim=2)
        v = v.repeat_interleave(per_group, dim=2)
        context = causal_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        context = context.transpose(1, 2).reshape(batch, length, heads * head_dim)
        x = x + linear(context, h + "self_attention.linear_proj")
        m = F.gelu(linear(norm(x, h + "pre_mlp_layernorm"), h + "mlp.linear_fc1"),
                   approximate="tanh")
        x = x + linear(m, h + "mlp.linear_fc2")
    x = norm(x, "decoder.final_layernorm")
    head = p.get("output_layer.weight", p["embedding.word_embeddings.weight"])
    logits = x @ head.t()
    return F.cross_entropy(logits.reshape(batch * length, -1), labels.reshape(-1))


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    distributed = os.path.isfile(os.path.join(sys.argv[1], "metadata.json"))
    if distributed:
        checkpoint = load_torch_dist(sys.argv[1])
    else:
        checkpoint, _ = load(sys.argv[1])
    args = checkpoint["args"]
    unsupported = [("position_embedding_type", "learned_absolute"), ("swiglu", False)]
    if not distributed:  # a rank file holds one shard
        unsupported += [("tensor_model_parallel_size", 1), ("pipeline_model_parallel_size", 1)]
    for name, built in unsupported:
        if getattr(args, name, built) != built:
            print(f"{sys.argv[1]}: {name} {getattr(args, name)!r} is not built here ({built!r} is)")
            return 2
    with open(sys.argv[2]) as f:
        batch = json.load(f)
    tokens = torch.tensor(batch["tokens"], dtype=torch.long)
    labels = torch.tensor(batch["labels"], dtype=torch.long)
    with torch.no_grad():
        loss = megatron_gpt_loss(local_spec_names(checkpoint["model"]), args, tokens, labels)
    if not math.isfinite(loss.item()):
        print("loss is not finite")
        return 2
    print(f"loss {loss.item():.17g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
