"""Megatron-LM legacy checkpoints (--ckpt-format torch), for megatron_checkpoint_test.cpp.

usage: write_megatron_checkpoints.py DIR

Writes with PyTorch itself (Debian's python3-torch), in the structures Megatron-LM's
megatron/training/checkpointing.py saves (generate_state_dict: 'args', 'checkpoint_version',
'iteration', 'model', 'optimizer', 'opt_param_scheduler', 'rng_state',
'num_floating_point_operations_so_far'; get_checkpoint_name: iter_XXXXXXX/mp_rank_TT[_PPP]/
model_optim_rng.pt; the tracker latest_checkpointed_iteration.txt), each into DIR/<name>:

  gpt_core      GPT-2-like (LayerNorm, biases, learned positions, tied embeddings), fp32,
                Megatron core's names with the local spec, TP=2 x PP=2 (the last stage holds
                output_layer.weight, its copy of the word embedding; linears carry
                _extra_state None as core's do)
  llama_legacy  Llama-like (RMSNorm, SwiGLU, RoPE, no biases, untied output, grouped-query
                attention with 2 groups of 2 heads), bf16, the legacy model's nested dicts
                (language_model.embedding / encoder / output_layer; input_norm, ...), TP=2 x PP=2
  llama_te      the same model at TP=1 x PP=1 in core's Transformer Engine names (the norms
                fused into linear_qkv and linear_fc1, _extra_state as TE 2.x keeps it: a uint8
                tensor, or None; and linear_fc2's as TE 1.x kept it: an io.BytesIO)
  bad_version   gpt_core at TP=1 x PP=1 with checkpoint_version 1.0
  bad_moe       gpt_core at TP=1 x PP=1 whose args have num_experts 8
  bad_name      gpt_core at TP=1 x PP=1 with a legacy layer tensor no Megatron model has
  bad_groups    gpt_core at TP=1 x PP=1 whose optimizer has the word embedding in a group of
                its own (as --decoupled-lr makes it)
  bad_moment    gpt_core at TP=1 x PP=1 with a flattened exp_avg of the first layer's QKV
  gpt_distributed  gpt_core saved by the distributed optimizer (--use-distributed-optimizer,
                --overlap-grad-reduce, --ddp-bucket-size 700): each rank directory's
                distrib_optim.pt holds the fp32 parameters and moments in the grad buffer's
                layout (distributed_optimizer_state below); the first stage's buffer is cut
                into several buckets, and the tied embedding's copies are buckets of their own
  llama_distributed  llama_te (bf16) saved by the distributed optimizer, one bucket
  bad_distributed    gpt_distributed at TP=1 x PP=1 whose distrib_optim.pt is for a model with
                one element fewer

  llama_weights llama_legacy at TP=1 x PP=1 saved without optimizer state (--no-save-optim)

The first three carry optimizer and scheduler state as Megatron's optimizers save it
(megatron_optimizer below): gpt_core FP32Optimizer's, llama_legacy
Float16OptimizerWithFloat16Params' with the fp32 main weights, llama_te the same as apex's
FusedAdam and Megatron before wd_mult keep it.

Each directory also gets expected.json: every tensor of the whole (unsharded) model by this
backend's names (Megatron core's, global layer indices), its shape and values as floats: the
fp32 main weights where the optimizer keeps them, else the model's. With optimizer state,
expected_moments.json holds the whole moments as optimizer.exp_avg.NAME and
optimizer.exp_avg_sq.NAME.
The sharding follows Megatron's tensor parallelism: word embedding, output layer, QKV and fc1
split by rows (fc1 under SwiGLU as each rank's gate rows, then its up rows), linear_proj and
linear_fc2 by columns, norms and the other biases replicated; QKV rows grouped per query group
(the group's query heads, then its key head, then its value head).
"""
import argparse
import collections
import io
import json
import math
import os
import random
import sys

import numpy
import torch

VOCAB = 40          # NullTokenizer's --vocab-size: 41 tokens with the eod
DIVISOR = 32        # --make-vocab-size-divisible-by; padded to 64 rows at TP 1 and 2
PADDED = 64
ITERATION = 20
CONSUMED = 160      # consumed_train_samples: 20 iterations of 8


def gpt_config():
    return dict(layers=4, hidden=16, heads=4, groups=4, ffn=32, seq=8, positions=8,
                norm="LayerNorm", swiglu=False, bias=True, rope=False, untied=False)


def llama_config():
    return dict(layers=4, hidden=16, heads=4, groups=2, ffn=24, seq=8, positions=8,
                norm="RMSNorm", swiglu=True, bias=False, rope=True, untied=True)


def whole_model(config, dtype, seed):
    """The whole model's tensors by this backend's names, values drawn from `seed`."""
    generator = torch.Generator().manual_seed(seed)
    c = config["hidden"]
    head = c // config["heads"]
    qkv_rows = (config["heads"] + 2 * config["groups"]) * head
    fc1_rows = 2 * config["ffn"] if config["swiglu"] else config["ffn"]
    tensors = collections.OrderedDict()

    def add(name, *shape):
        tensors[name] = (torch.randn(*shape, generator=generator) * 0.5).to(dtype)

    def add_norm(name):
        add(name + ".weight", c)
        if config["norm"] == "LayerNorm":
            add(name + ".bias", c)

    def add_linear(name, rows, columns):
        add(name + ".weight", rows, columns)
        if config["bias"]:
            add(name + ".bias", rows)

    add("embedding.word_embeddings.weight", PADDED, c)
    if not config["rope"]:
        add("embedding.position_embeddings.weight", config["positions"], c)
    for layer in range(config["layers"]):
        p = f"decoder.layers.{layer}."
        add_norm(p + "input_layernorm")
        add_linear(p + "self_attention.linear_qkv", qkv_rows, c)
        add_linear(p + "self_attention.linear_proj", c, config["heads"] * head)
        add_norm(p + "pre_mlp_layernorm")
        add_linear(p + "mlp.linear_fc1", fc1_rows, c)
        add_linear(p + "mlp.linear_fc2", c, config["ffn"])
    add_norm("decoder.final_layernorm")
    if config["untied"]:
        add("output_layer.weight", PADDED, c)
    return tensors


def shard(name, tensor, config, tp, rank):
    """Tensor-parallel rank `rank`'s shard of `tensor`, as Megatron's layers hold it."""
    if tp == 1:
        return tensor.clone()
    rows = ("word_embeddings.weight", "output_layer.weight", "linear_qkv.weight",
            "linear_qkv.bias", "linear_fc1.weight", "linear_fc1.bias")
    columns = ("linear_proj.weight", "linear_fc2.weight")
    if name.endswith(("linear_fc1.weight", "linear_fc1.bias")) and config["swiglu"]:
        gate, up = torch.chunk(tensor, 2, dim=0)
        return torch.cat([torch.chunk(gate, tp, dim=0)[rank], torch.chunk(up, tp, dim=0)[rank]])
    if name.endswith(rows):
        return torch.chunk(tensor, tp, dim=0)[rank].clone()
    if name.endswith(columns):
        return torch.chunk(tensor, tp, dim=1)[rank].clone()
    return tensor.clone()


def stage_tensors(whole, config, tp, rank, pp, stage):
    """The (rank, stage)'s tensors by core's names, with the stage's local layer indices."""
    per_stage = config["layers"] // pp
    first, last = stage * per_stage, (stage + 1) * per_stage
    out = collections.OrderedDict()
    for name, tensor in whole.items():
        if name.startswith("decoder.layers."):
            layer = int(name.split(".")[2])
            if not first <= layer < last:
                continue
            local = ".".join(["decoder", "layers", str(layer - first)] + name.split(".")[3:])
            out[local] = shard(name, tensor, config, tp, rank)
        elif name.startswith("embedding."):
            if stage == 0:
                out[name] = shard(name, tensor, config, tp, rank)
        elif stage == pp - 1:
            out[name] = shard(name, tensor, config, tp, rank)
    # Tied embeddings: the last stage keeps its own copy of the word embedding.
    if not config["untied"] and pp > 1 and stage == pp - 1:
        out["output_layer.weight"] = shard("output_layer.weight",
                                           whole["embedding.word_embeddings.weight"],
                                           config, tp, rank)
    return out


def core_local(tensors):
    """Core's local spec: the names as they are, with linears' _extra_state None."""
    out = collections.OrderedDict()
    for name, tensor in tensors.items():
        out[name] = tensor
        if name.endswith(".weight") and ("linear_" in name or name == "output_layer.weight"):
            out[name[:-len("weight")] + "_extra_state"] = None
    return out


def core_transformer_engine(tensors):
    """Core's TE spec: the norms fused into the next linear, TE 2.x's _extra_state."""
    renames = {"input_layernorm.weight": "self_attention.linear_qkv.layer_norm_weight",
               "input_layernorm.bias": "self_attention.linear_qkv.layer_norm_bias",
               "pre_mlp_layernorm.weight": "mlp.linear_fc1.layer_norm_weight",
               "pre_mlp_layernorm.bias": "mlp.linear_fc1.layer_norm_bias"}
    out = collections.OrderedDict()
    for name, tensor in tensors.items():
        for old, new in renames.items():
            if name.endswith("." + old):
                name = name[:-len(old)] + new
        out[name] = tensor
        if name.endswith("linear_qkv.weight"):
            out[name[:-len("weight")] + "_extra_state"] = torch.tensor([128, 3, 1],
                                                                        dtype=torch.uint8)
            out[name.replace("linear_qkv.weight", "core_attention._extra_state")] = None
        if name.endswith("linear_fc2.weight"):  # as Transformer Engine 1.x kept it
            buffer = io.BytesIO()
            torch.save({"scale_fwd": torch.ones(2)}, buffer)
            out[name[:-len("weight")] + "_extra_state"] = buffer
    return out


def legacy(tensors):
    """The legacy model's nested dicts, with its post-September-2023 norm names."""
    layer_names = {"input_layernorm.": "input_norm.",
                   "self_attention.linear_qkv.": "self_attention.query_key_value.",
                   "self_attention.linear_proj.": "self_attention.dense.",
                   "pre_mlp_layernorm.": "post_attention_norm.",
                   "mlp.linear_fc1.": "mlp.dense_h_to_4h.",
                   "mlp.linear_fc2.": "mlp.dense_4h_to_h."}
    embedding = collections.OrderedDict()
    encoder = collections.OrderedDict()
    language_model = collections.OrderedDict()
    model = collections.OrderedDict()
    for name, tensor in tensors.items():
        if name.startswith("embedding."):
            table = name.split(".")[1]
            embedding[table] = collections.OrderedDict(weight=tensor)
        elif name.startswith("decoder.layers."):
            parts = name.split(".")
            rest = ".".join(parts[3:])
            for old, new in layer_names.items():
                if rest.startswith(old):
                    rest = new + rest[len(old):]
            encoder[f"layers.{parts[2]}.{rest}"] = tensor
        elif name.startswith("decoder.final_layernorm."):
            encoder["final_norm." + name.split(".")[-1]] = tensor
        elif name == "output_layer.weight":
            language_model["output_layer"] = collections.OrderedDict(weight=tensor)
        else:
            raise ValueError(name)
    if embedding:
        language_model["embedding"] = embedding
    language_model["encoder"] = encoder
    model["language_model"] = language_model
    return model


def megatron_args(config, tp, pp, bf16):
    """The argparse.Namespace Megatron saves, with the attributes a GPT run has."""
    return argparse.Namespace(
        num_layers=config["layers"], hidden_size=config["hidden"],
        ffn_hidden_size=config["ffn"], num_attention_heads=config["heads"],
        kv_channels=config["hidden"] // config["heads"],
        group_query_attention=config["groups"] != config["heads"],
        num_query_groups=config["groups"], seq_length=config["seq"],
        max_position_embeddings=config["positions"],
        position_embedding_type="rope" if config["rope"] else "learned_absolute",
        rotary_percent=1.0, rotary_base=10000, normalization=config["norm"], norm_epsilon=1e-5,
        apply_layernorm_1p=False, swiglu=config["swiglu"], add_bias_linear=config["bias"],
        add_qkv_bias=config["bias"],
        untie_embeddings_and_output_weights=config["untied"], hidden_dropout=0.0,
        attention_dropout=0.0, init_method_std=0.02, tokenizer_type="NullTokenizer",
        vocab_size=VOCAB, make_vocab_size_divisible_by=DIVISOR, padded_vocab_size=PADDED,
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=None, num_layers_per_virtual_pipeline_stage=None,
        decoder_first_pipeline_num_layers=None, decoder_last_pipeline_num_layers=None,
        num_experts=None, micro_batch_size=2, global_batch_size=8, train_iters=100,
        lr=3e-4, min_lr=3e-5, lr_decay_style="cosine", lr_warmup_iters=5, weight_decay=0.1,
        adam_beta1=0.9, adam_beta2=0.95, adam_eps=1e-8, clip_grad=1.0, seed=1234,
        bf16=bf16, fp16=False, params_dtype=torch.bfloat16 if bf16 else torch.float32,
        consumed_train_samples=CONSUMED, consumed_valid_samples=32, data_parallel_size=1,
        world_size=tp * pp, rank=0, ckpt_format="torch", use_distributed_optimizer=False,
        overlap_grad_reduce=False, ddp_bucket_size=None, ddp_num_buckets=None,
        overlap_param_gather_with_optimizer_step=False)


def flatten(model, prefix=""):
    """The model state dict's tensors by dotted name, in order (as Megatron's named_parameters()
    walks the same modules), without the _extra_state entries, which are not parameters."""
    out = []
    for key, value in model.items():
        name = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict):
            out.extend(flatten(value, name))
        elif isinstance(value, torch.Tensor) and not name.endswith("_extra_state"):
            out.append((name, value))
    return out


def megatron_optimizer(parameters, main, exp_avg, exp_avg_sq, kind):
    """The 'optimizer' entry of one rank's file for the parameters (Megatron name, model tensor)
    in the model's order; main/exp_avg/exp_avg_sq give each one's fp32 main weight and moments.

    kind "fp32": FP32Optimizer.state_dict(), torch's AdamW state dict itself; "mixed":
    Float16OptimizerWithFloat16Params.state_dict() ({'optimizer', 'fp32_from_fp16_params'});
    "apex": the same as apex's FusedAdam keeps it (the step in the groups, not per parameter)
    with groups as Megatron made them before wd_mult (weight_decay 0.0 for the no-decay group).
    The groups are _get_param_groups's at Megatron-LM's HEAD: the decayed parameters first, then
    the biases and 1-D ones with wd_mult 0.
    """
    decayed = [i for i, (name, t) in enumerate(parameters)
               if not (name.endswith(".bias") or t.dim() == 1)]
    undecayed = [i for i in range(len(parameters)) if i not in decayed]
    weights = [torch.nn.Parameter(main[i].clone()) for i in range(len(parameters))]
    extra = dict(is_expert_parallel=False, default_config=True, lr_mult=1.0,
                 is_decoupled_lr=False, max_lr=3e-4, min_lr=3e-5)
    if kind == "split":  # the word embedding in a group of its own (as --decoupled-lr does)
        groups = [dict(params=[weights[decayed[0]]], wd_mult=1.0, **extra),
                  dict(params=[weights[i] for i in decayed[1:]], wd_mult=1.0, **extra),
                  dict(params=[weights[i] for i in undecayed], wd_mult=0.0, **extra)]
    elif kind == "apex":
        groups = [dict(params=[weights[i] for i in decayed]),
                  dict(params=[weights[i] for i in undecayed], weight_decay=0.0)]
    else:
        groups = [dict(params=[weights[i] for i in decayed], wd_mult=1.0, **extra),
                  dict(params=[weights[i] for i in undecayed], wd_mult=0.0, **extra)]
    adam = torch.optim.AdamW(groups, lr=2.9e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    for i, weight in enumerate(weights):
        adam.state[weight] = {"step": torch.tensor(float(ITERATION)),
                              "exp_avg": exp_avg[i].clone(),
                              "exp_avg_sq": exp_avg_sq[i].clone()}
    state = adam.state_dict()
    if kind in ("fp32", "split"):
        return state
    if kind == "apex":
        for per_parameter in state["state"].values():
            del per_parameter["step"]
        for group in state["param_groups"]:
            group["step"] = ITERATION
    if kind == "distributed":
        # DistributedOptimizer.state_dict(): the groups without their parameters, the step in
        # each (TE's FusedAdam); the moments go to distrib_optim.pt.
        for group in state["param_groups"]:
            del group["params"]
            group["step"] = ITERATION
        return {"optimizer": {"param_groups": state["param_groups"]}}
    return {"optimizer": state,
            "fp32_from_fp16_params": [[weights[i] for i in decayed],
                                      [weights[i] for i in undecayed]]}


def buffer_layout(numels, shared, bucket_size, data_parallel_size=1):
    """Megatron core's DistributedOptimizer._compute_per_buffer_param_layout for one buffer's
    parameters (their numels in named_parameters() order; `shared`: whether each is a tied
    embedding's copy on a pipeline stage, shared_embedding): the parameters in reverse order,
    each one's start aligned to 64 elements, a bucket closed once it holds bucket_size elements
    (None: never) and around a shared embedding, each bucket's end padded to lcm(dp, 128).
    Returns each parameter's (start, bucket) and the buckets' (start, numel_unpadded)."""
    divisor = math.lcm(data_parallel_size, 128)
    starts = [None] * len(numels)
    buckets = []
    start = bucket_start = 0
    in_bucket = 0

    def close(end):
        buckets.append((bucket_start, end - bucket_start))
        return -(-end // divisor) * divisor

    for i in reversed(range(len(numels))):
        start = -(-start // 64) * 64
        if shared[i] and in_bucket:
            bucket_start = start = close(start)
            in_bucket = 0
        end = start + numels[i]
        starts[i] = (start, len(buckets))
        in_bucket += 1
        if (bucket_size is not None and end - bucket_start >= bucket_size) or shared[i]:
            bucket_start = start = close(end)
            in_bucket = 0
        else:
            start = end
    if in_bucket:
        close(end)
    return starts, buckets


def distributed_optimizer_state(parameters, main, exp_avg, exp_avg_sq, shared, bucket_size,
                                dtypes):
    """distrib_optim.pt of one model chunk's buffer, as get_parameter_state_dp_zero gathers it
    on data-parallel rank 0: per state key one fp32 tensor of the buffer's buckets one after the
    other, each bucket's end padding left out ('numel_unpadded' elements)."""
    starts, buckets = buffer_layout([t.numel() for _, t in parameters], shared, bucket_size)
    total = sum(numel for _, numel in buckets)
    world_start = [sum(numel for _, numel in buckets[:b]) for b in range(len(buckets))]
    world = {}
    for key, values in (("param", main), ("exp_avg", exp_avg), ("exp_avg_sq", exp_avg_sq)):
        tensor = torch.zeros(total, dtype=torch.float32)
        for i, (start, bucket) in enumerate(starts):
            at = world_start[bucket] + start - buckets[bucket][0]
            tensor[at:at + values[i].numel()] = values[i].flatten()
        world[key] = tensor
    world["numel_unpadded"] = total
    return {"buckets_coalesced": True, 0: {dtypes: world}}


def whole_moments(whole, seed):
    """Adam's first and second moments of every whole tensor (the second positive)."""
    generator = torch.Generator().manual_seed(seed)
    exp_avg = collections.OrderedDict(
        (name, torch.randn(*t.shape, generator=generator) * 1e-3) for name, t in whole.items())
    exp_avg_sq = collections.OrderedDict(
        (name, torch.rand(*t.shape, generator=generator) * 1e-5) for name, t in whole.items())
    return exp_avg, exp_avg_sq


def save(directory, config, tp, pp, dtype, seed, naming, optimizer=None, version=3.0,
         args_edit=None, model_edit=None, state_edit=None):
    # The fp32 main weights; the model holds them in `dtype` (bf16: rounded), as Megatron's.
    whole = whole_model(config, torch.float32, seed)
    exp_avg, exp_avg_sq = whole_moments(whole, seed + 100)
    iteration_dir = os.path.join(directory, f"iter_{ITERATION:07d}")
    for stage in range(pp):
        for rank in range(tp):
            main = stage_tensors(whole, config, tp, rank, pp, stage)
            tensors = collections.OrderedDict((n, t.to(dtype)) for n, t in main.items())
            model = naming(tensors)
            if model_edit is not None:
                model_edit(model)
            args = megatron_args(config, tp, pp, dtype == torch.bfloat16)
            args.rank = stage * tp + rank
            if args_edit is not None:
                args_edit(args)
            state = {
                "args": args,
                "checkpoint_version": version,
                "iteration": ITERATION,
                "model": model,
                "rng_state": [{"random_rng_state": random.getstate(),
                               "np_rng_state": numpy.random.get_state(),
                               "torch_rng_state": torch.get_rng_state(),
                               "rng_tracker_states": {}}],
                "num_floating_point_operations_so_far": 12345,
            }
            if optimizer is not None:
                # Each model tensor's name in `tensors` (the naming keeps the objects).
                local_name = {id(t): n for n, t in tensors.items()}
                parameters = flatten(model)
                names = [local_name[id(t)] for _, t in parameters]
                averages = stage_tensors(exp_avg, config, tp, rank, pp, stage)
                squares = stage_tensors(exp_avg_sq, config, tp, rank, pp, stage)
                state["optimizer"] = megatron_optimizer(
                    parameters, [main[n] for n in names], [averages[n] for n in names],
                    [squares[n] for n in names], optimizer)
                if optimizer == "distributed":
                    # The tied embedding's copies (PP > 1): the first stage's word embedding,
                    # the last stage's output layer.
                    tied = not config["untied"] and pp > 1
                    shared = [tied and ((stage == 0 and n == "embedding.word_embeddings.weight")
                                        or (stage == pp - 1 and n == "output_layer.weight"))
                              for n in names]
                    # Bucketing is off but on the first stage (training.py: get_model).
                    bucket_size = args.ddp_bucket_size if args.overlap_grad_reduce and \
                        stage == 0 else None
                    dtypes = (dtype, torch.float32)
                    distributed = distributed_optimizer_state(
                        parameters, [main[n] for n in names], [averages[n] for n in names],
                        [squares[n] for n in names], shared, bucket_size, dtypes)
                state["opt_param_scheduler"] = {
                    "max_lr": 3e-4, "lr_warmup_steps": 40, "num_steps": CONSUMED,
                    "lr_decay_style": "cosine", "lr_decay_steps": 800, "min_lr": 3e-5,
                    "start_wd": 0.1, "end_wd": 0.1, "wd_incr_style": "constant",
                    "wd_incr_steps": 800}
            if state_edit is not None:
                state_edit(state)
            name = f"mp_rank_{rank:02d}" if pp == 1 else f"mp_rank_{rank:02d}_{stage:03d}"
            os.makedirs(os.path.join(iteration_dir, name), exist_ok=True)
            torch.save(state, os.path.join(iteration_dir, name, "model_optim_rng.pt"))
            if optimizer == "distributed":
                if state_edit is not None:
                    state_edit(distributed)
                torch.save(distributed, os.path.join(iteration_dir, name, "distrib_optim.pt"))
    with open(os.path.join(directory, "latest_checkpointed_iteration.txt"), "w") as tracker:
        tracker.write(str(ITERATION))
    # The weights read: the fp32 main weights where the optimizer keeps them, else the model's.
    read = whole if optimizer is not None else {n: t.to(dtype) for n, t in whole.items()}
    expected = {name: {"shape": list(t.shape), "values": t.float().flatten().tolist()}
                for name, t in read.items()}
    with open(os.path.join(directory, "expected.json"), "w") as out:
        json.dump(expected, out)
    if optimizer is not None:
        moments = {}
        for prefix, values in (("optimizer.exp_avg.", exp_avg), ("optimizer.exp_avg_sq.",
                                                                  exp_avg_sq)):
            for name, t in values.items():
                moments[prefix + name] = {"shape": list(t.shape),
                                          "values": t.flatten().tolist()}
        with open(os.path.join(directory, "expected_moments.json"), "w") as out:
            json.dump(moments, out)


def main():
    out = sys.argv[1]
    random.seed(0)
    numpy.random.seed(0)
    torch.manual_seed(0)
    gpt, llama = gpt_config(), llama_config()
    save(os.path.join(out, "gpt_core"), gpt, 2, 2, torch.float32, 1, core_local, "fp32")
    save(os.path.join(out, "llama_legacy"), llama, 2, 2, torch.bfloat16, 2, legacy, "mixed")
    save(os.path.join(out, "llama_te"), llama, 1, 1, torch.bfloat16, 2, core_transformer_engine,
         "apex")
    save(os.path.join(out, "llama_weights"), llama, 1, 1, torch.bfloat16, 2, legacy)
    save(os.path.join(out, "bad_version"), gpt, 1, 1, torch.float32, 1, core_local, version=1.0)
    save(os.path.join(out, "bad_moe"), gpt, 1, 1, torch.float32, 1, core_local,
         args_edit=lambda args: setattr(args, "num_experts", 8))

    save(os.path.join(out, "bad_groups"), gpt, 1, 1, torch.float32, 1, core_local, "split")

    def reshape_moment(state):
        state["optimizer"]["state"][2]["exp_avg"] = \
            state["optimizer"]["state"][2]["exp_avg"].flatten()
    save(os.path.join(out, "bad_moment"), gpt, 1, 1, torch.float32, 1, core_local, "fp32",
         state_edit=reshape_moment)

    def distributed_args(args):
        args.use_distributed_optimizer = True
        args.overlap_grad_reduce = True
        args.ddp_bucket_size = 700
    save(os.path.join(out, "gpt_distributed"), gpt, 2, 2, torch.float32, 1, core_local,
         "distributed", args_edit=distributed_args)
    save(os.path.join(out, "llama_distributed"), llama, 1, 1, torch.bfloat16, 2,
         core_transformer_engine, "distributed",
         args_edit=lambda args: setattr(args, "use_distributed_optimizer", True))

    def one_element_fewer(state):
        if "buckets_coalesced" in state:
            world = state[0][(torch.float32, torch.float32)]
            for key in ("param", "exp_avg", "exp_avg_sq"):
                world[key] = world[key][:-1].clone()
            world["numel_unpadded"] -= 1
    save(os.path.join(out, "bad_distributed"), gpt, 1, 1, torch.float32, 1, core_local,
         "distributed", args_edit=distributed_args, state_edit=one_element_fewer)

    def add_unknown(model):
        model["language_model"]["encoder"]["layers.0.self_attention.rotary.inv_freq"] = \
            torch.ones(2)
    save(os.path.join(out, "bad_name"), gpt, 1, 1, torch.float32, 1, legacy,
         model_edit=add_unknown)


if __name__ == "__main__":
    main()
