"""Each parameter's fp32 weight and Adam moments in one rank directory of a Megatron-LM legacy
checkpoint, as Megatron's own code finds them, printed as JSON.

usage: megatron_parameter_state.py RANK_DIR

For megatron_checkpoint_writer_test.cpp. RANK_DIR/model_optim_rng.pt is loaded with
load_torch_checkpoint.py's restricted loader; the parameters are its model's tensors in
named_parameters() order (the state dict without _extra_state). Without the distributed
optimizer the state is the optimizer's own (torch's state dict, numbered across the param groups
in order; the fp32 main weights of Float16OptimizerWithFloat16Params). With it, the state is
RANK_DIR/distrib_optim.pt's, each parameter found at its place in the grad buffer as
write_megatron_checkpoints.py's buffer_layout lays it out after Megatron core's
DistributedOptimizer (reverse order, 64-element alignment, buckets of --ddp-bucket-size on the
first stage under --overlap-grad-reduce, the tied embedding's copies in buckets of their own).

The JSON: {"distributed": bool, "dtypes": [param dtype, grad dtype] or null, "parameters":
{"CHUNK:NAME": {"param": [...], "exp_avg": [...], "exp_avg_sq": [...], "weight": [...]}}}, each
list flat; "weight" is the model's tensor (16-bit in a bf16 or fp16 run), "param" the fp32 one.
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import load_torch_checkpoint  # noqa: E402
import write_megatron_checkpoints  # noqa: E402


def main():
    directory = sys.argv[1]
    state, _ = load_torch_checkpoint.load(os.path.join(directory, "model_optim_rng.pt"))
    args = state["args"]
    chunks = [state["model"]] if "model" in state else \
        [state[f"model{i}"] for i in range(len([k for k in state if k.startswith("model")]))]
    out = {"parameters": {}, "dtypes": None}
    optimizer = state["optimizer"]
    inner = optimizer.get("optimizer", optimizer)
    out["distributed"] = "state" not in inner
    if out["distributed"]:
        buffers, _ = load_torch_checkpoint.load(os.path.join(directory, "distrib_optim.pt"))
        assert buffers["buckets_coalesced"] is True
        pp = args.pipeline_model_parallel_size
        tied = not args.untie_embeddings_and_output_weights and pp > 1
        for index, model in enumerate(chunks):
            parameters = write_megatron_checkpoints.flatten(model)
            names = [name for name, _ in parameters]
            shared = [tied and name in ("embedding.word_embeddings.weight", "output_layer.weight")
                      for name in names]
            first = "embedding.word_embeddings.weight" in names
            bucket_size = None
            if getattr(args, "overlap_grad_reduce", False) and first:
                bucket_size = getattr(args, "ddp_bucket_size", None) or \
                    max(40000000, 1000000 * args.data_parallel_size)
            starts, buckets = write_megatron_checkpoints.buffer_layout(
                [t.numel() for _, t in parameters], shared, bucket_size)
            (dtypes, world), = buffers[index].items()
            out["dtypes"] = [str(d) for d in dtypes]
            assert world["numel_unpadded"] == sum(n for _, n in buckets)
            world_start = [sum(n for _, n in buckets[:b]) for b in range(len(buckets))]
            for i, (name, tensor) in enumerate(parameters):
                start, bucket = starts[i]
                at = world_start[bucket] + start - buckets[bucket][0]
                key = f"{index}:{name}"
                out["parameters"][key] = {
                    k: world[k][at:at + tensor.numel()].tolist()
                    for k in ("param", "exp_avg", "exp_avg_sq")}
                out["parameters"][key]["weight"] = tensor.float().flatten().tolist()
    else:
        moments = inner["state"]
        index = 0
        main_groups = optimizer.get("fp32_from_fp16_params")
        by_index = {}
        for g, group in enumerate(inner["param_groups"]):
            for j, number in enumerate(group["params"]):
                by_index[number] = (main_groups[g][j] if main_groups else None, moments[number])
        # torch numbers the parameters across the groups; match them back by the groups'
        # weight-decay split of the model's order.
        ordered = []
        for model_index, model in enumerate(chunks):
            for name, tensor in write_megatron_checkpoints.flatten(model):
                ordered.append((f"{model_index}:{name}", tensor))
        decayed = [(n, t) for n, t in ordered if not (n.endswith(".bias") or t.dim() == 1)]
        undecayed = [(n, t) for n, t in ordered if n.endswith(".bias") or t.dim() == 1]
        for name, tensor in decayed + undecayed:
            main, moment = by_index[index]
            out["parameters"][name] = {
                "param": (main if main is not None else tensor).float().flatten().tolist(),
                "exp_avg": moment["exp_avg"].flatten().tolist(),
                "exp_avg_sq": moment["exp_avg_sq"].flatten().tolist(),
                "weight": tensor.float().flatten().tolist()}
            index += 1
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
