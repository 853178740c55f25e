"""Megatron core torch_dist checkpoints written by PyTorch's own distributed-checkpoint writer,
for megatron_dist_checkpoint_test.cpp and the e2e tests.

Each checkpoint is what Megatron-LM's save_checkpoint writes with --ckpt-format torch_dist
(megatron/core/dist_checkpointing: serialization.save, strategies/torch.py's
TorchDistSaveShardedStrategy, strategies/common.py's save_common):
  DIR/latest_checkpointed_iteration.txt
  DIR/iter_0000020/metadata.json     {"sharded_backend": "torch_dist", ...}
  DIR/iter_0000020/common.pt         torch.save of the state that is not sharded: args,
                                     iteration, checkpoint_version, the optimizer's param
                                     groups and step, opt_param_scheduler
  DIR/iter_0000020/.metadata         PyTorch DCP's Metadata, pickled
  DIR/iter_0000020/__R_0.distcp      each rank's chunks, one torch.save blob per chunk
The sharded state is Megatron core's sharded_state_dict, with every rank's shards given to
PyTorch as a ShardedTensor of the global shape (sharded_tensor_to_torch_sharded_tensor):
  - the layers' tensors stacked on a first axis of --num-layers (TransformerBlock's
    sharded_state_dict: the key decoder.layers.<name>, offset (0, global layer, num_layers));
  - the tensor-parallel axis of each linear (rows of linear_qkv, linear_fc1, the vocabulary
    tables; columns of linear_proj and linear_fc2); SwiGLU's fc1 as two shards per rank, its
    gate part at rank t of 2 tp and its up part at tp + t (apply_swiglu_sharded_factory);
  - a replicated tensor (a norm, a row-parallel bias, the position table) saved once, by
    tensor-parallel rank 0 of its stage (replica_id 0);
  - with tied embeddings the last stage's output layer is the word embedding's replica and is
    not saved;
  - the optimizer's state under optimizer.state.{exp_avg,exp_avg_sq}.<key> (and
    optimizer.state.fp32_param.<key> for the main weights of a bf16 run), sharded as the
    parameter (optim_state_to_sharding_state, make_sharded_optimizer_tensor);
  - the RNG state as a ShardedObject (bytes) rng_state/shard_<stage>.<rank>_<pp>.<tp>.
The processes are tp × pp CPU ranks over gloo, spawned here. The same weights and moments as
write_megatron_checkpoints.py's for the same config and seed, and the same expected.json and
expected_moments.json.

Usage: /usr/bin/python3 write_torch_dist_checkpoints.py OUT
"""
import argparse
import collections
import io
import json
import os
import random
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing  # noqa: E402
from torch_distributed_checkpoint import (FileSystemWriter, MCoreSavePlanner,  # noqa: E402
                                         Shard, init_from_local_shards, save_state_dict)
from write_megatron_checkpoints import (CONSUMED, ITERATION, gpt_config,  # noqa: E402
                                        llama_config, megatron_args, whole_model, whole_moments)

ROWS = ("word_embeddings.weight", "output_layer.weight", "linear_qkv.weight", "linear_qkv.bias",
        "linear_fc1.weight", "linear_fc1.bias")
COLUMNS = ("linear_proj.weight", "linear_fc2.weight")


def sharded_keys(whole, config):
    """Megatron core's sharded keys of the model: (key, global shape, the whole tensors' names
    stacked under it, layer-stacked)."""
    keys = collections.OrderedDict()
    for name, tensor in whole.items():
        if name.startswith("decoder.layers."):
            parts = name.split(".")
            key = "decoder.layers." + ".".join(parts[3:])
            if key not in keys:
                keys[key] = ([config["layers"]] + list(tensor.shape), [], True)
            keys[key][1].append(name)
        else:
            keys[name] = (list(tensor.shape), [name], False)
    return keys


def local_shards(key, stacked, names, whole, config, tp, rank, pp, stage):
    """(tensor, global offsets) of every shard rank (rank, stage) saves of `key`."""
    per_stage = config["layers"] // pp
    if stacked:
        layers = range(stage * per_stage, (stage + 1) * per_stage)
        pieces = [(whole[names[layer]], [layer]) for layer in layers]
    elif key.startswith("embedding."):
        pieces = [(whole[names[0]], [])] if stage == 0 else []
    else:
        pieces = [(whole[names[0]], [])] if stage == pp - 1 else []
    out = []
    for tensor, prefix in pieces:
        prepend = [1] * len(prefix)
        zeros = [0] * (tensor.dim() - 1)
        if key.endswith(("linear_fc1.weight", "linear_fc1.bias")) and config["swiglu"]:
            rows = tensor.shape[0] // (2 * tp)
            for half in (0, 1):
                index = half * tp + rank
                piece = tensor[index * rows:(index + 1) * rows]
                out.append((piece.reshape(prepend + list(piece.shape)),
                            prefix + [index * rows] + zeros))
        elif key.endswith(ROWS):
            rows = tensor.shape[0] // tp
            piece = tensor[rank * rows:(rank + 1) * rows]
            out.append((piece.reshape(prepend + list(piece.shape)), prefix + [rank * rows] + zeros))
        elif key.endswith(COLUMNS):
            columns = tensor.shape[1] // tp
            piece = tensor[:, rank * columns:(rank + 1) * columns]
            out.append((piece.reshape(prepend + list(piece.shape)), prefix + [0, rank * columns]))
        elif rank == 0:  # replicated: replica 0 saves it
            out.append((tensor.reshape(prepend + list(tensor.shape)), prefix + [0] * tensor.dim()))
    return out


def sharded_tensor(key, shape, stacked, names, whole, config, tp, rank, pp, stage, dtype):
    global_rank = dist.get_rank()
    shards = [Shard.from_tensor_and_offsets(t.to(dtype).contiguous(), offsets, global_rank)
              for t, offsets in local_shards(key, stacked, names, whole, config, tp, rank, pp,
                                             stage)]
    return init_from_local_shards(shards, *shape)


def param_groups(keys, whole):
    """The optimizer's param groups as common.pt keeps them: without 'params', which
    optim_state_to_sharding_state makes non-persistent."""
    extra = dict(is_expert_parallel=False, default_config=True, lr_mult=1.0,
                 is_decoupled_lr=False, max_lr=3e-4, min_lr=3e-5, lr=2.9e-4, betas=(0.9, 0.95),
                 eps=1e-8, amsgrad=False, maximize=False, foreach=None, capturable=False,
                 differentiable=False, fused=None)
    return [dict(wd_mult=1.0, weight_decay=0.1, **extra),
            dict(wd_mult=0.0, weight_decay=0.0, **extra)]


def save_rank(rank_index, directory, config, tp, pp, dtype, seed, optimizer, rendezvous, step):
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank_index,
                            world_size=tp * pp)
    stage, rank = divmod(rank_index, tp)
    whole = whole_model(config, torch.float32, seed)
    exp_avg, exp_avg_sq = whole_moments(whole, seed + 100)
    keys = sharded_keys(whole, config)
    state = collections.OrderedDict()
    parts = [("", whole, dtype)]
    if optimizer:
        parts += [("optimizer.state.exp_avg.", exp_avg, torch.float32),
                  ("optimizer.state.exp_avg_sq.", exp_avg_sq, torch.float32)]
        if dtype != torch.float32:
            parts.append(("optimizer.state.fp32_param.", whole, torch.float32))
    for prefix, tensors, part_dtype in parts:
        for key, (shape, names, stacked) in keys.items():
            state[prefix + key] = sharded_tensor(key, shape, stacked, names, tensors, config, tp,
                                                 rank, pp, stage, part_dtype)
    rng = {"random_rng_state": random.getstate(), "np_rng_state": numpy.random.get_state(),
           "torch_rng_state": torch.get_rng_state(), "rng_tracker_states": {}}
    buffer = io.BytesIO()
    torch.save([rng], buffer)
    buffer.seek(0)
    state[f"rng_state/shard_{stage}.{rank}_{pp}.{tp}"] = buffer
    save_state_dict(state, FileSystemWriter(directory, single_file_per_rank=True),
                    planner=MCoreSavePlanner())
    dist.barrier()
    dist.destroy_process_group()


def save(directory, config, tp, pp, dtype, seed, optimizer=True, step="common_step",
         common_edit=None):
    iteration_dir = os.path.join(directory, f"iter_{ITERATION:07d}")
    os.makedirs(iteration_dir, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        rendezvous = os.path.join(scratch, "rendezvous")
        torch.multiprocessing.spawn(
            save_rank, nprocs=tp * pp,
            args=(iteration_dir, config, tp, pp, dtype, seed, optimizer, rendezvous, step))
    whole = whole_model(config, torch.float32, seed)
    args = megatron_args(config, tp, pp, dtype == torch.bfloat16)
    args.ckpt_format = "torch_dist"
    common = {"args": args, "checkpoint_version": 3.0, "iteration": ITERATION,
              "num_floating_point_operations_so_far": 12345}
    if optimizer:
        count = len(sharded_keys(whole, config))
        torch_state = {"state": {i: {} for i in range(count)},
                       "param_groups": param_groups(sharded_keys(whole, config), whole)}
        if step == "common_step":
            torch_state["state"]["common_step"] = torch.tensor(float(ITERATION))
        common["optimizer"] = torch_state if dtype == torch.float32 else {
            "optimizer": torch_state, "fp32_from_fp16_params": [[], []]}
        common["opt_param_scheduler"] = {
            "max_lr": 3e-4, "lr_warmup_steps": 40, "num_steps": CONSUMED,
            "lr_decay_style": "cosine", "lr_decay_steps": 800, "min_lr": 3e-5,
            "start_wd": 0.1, "end_wd": 0.1, "wd_incr_style": "constant", "wd_incr_steps": 800}
    if common_edit is not None:
        common_edit(common)
    torch.save(common, os.path.join(iteration_dir, "common.pt"))
    with open(os.path.join(iteration_dir, "metadata.json"), "w") as out:
        json.dump({"sharded_backend": "torch_dist", "sharded_backend_version": 1,
                   "common_backend": "torch", "common_backend_version": 1}, out)
    with open(os.path.join(directory, "latest_checkpointed_iteration.txt"), "w") as tracker:
        tracker.write(str(ITERATION))
    read = whole if optimizer else {n: t.to(dtype) for n, t in whole.items()}
    expected = {name: {"shape": list(t.shape), "values": t.float().flatten().tolist()}
                for name, t in read.items()}
    with open(os.path.join(directory, "expected.json"), "w") as out:
        json.dump(expected, out)
    if optimizer:
        exp_avg, exp_avg_sq = whole_moments(whole, seed + 100)
        moments = {}
        for prefix, values in (("optimizer.exp_avg.", exp_avg), ("optimizer.exp_avg_sq.",
                                                                  exp_avg_sq)):
            for name, t in values.items():
                moments[prefix + name] = {"shape": list(t.shape), "values": t.flatten().tolist()}
        with open(os.path.join(directory, "expected_moments.json"), "w") as out:
            json.dump(moments, out)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    out = parser.parse_args().out
    random.seed(0)
    numpy.random.seed(0)
    torch.manual_seed(0)
    gpt, llama = gpt_config(), llama_config()
    save(os.path.join(out, "gpt_dist"), gpt, 2, 2, torch.float32, 1)
    save(os.path.join(out, "llama_dist"), llama, 2, 1, torch.bfloat16, 2, step="none")
    save(os.path.join(out, "gpt_dist_weights"), gpt, 1, 2, torch.float32, 1, optimizer=False)


if __name__ == "__main__":
    main()
