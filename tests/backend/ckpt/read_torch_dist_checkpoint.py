"""Reads a torch_dist checkpoint's iteration directory with PyTorch's own code, and prints it
as JSON: for megatron_dist_checkpoint_writer_test.cpp and the e2e tests of --ckpt-format
torch_dist saves.

usage: read_torch_dist_checkpoint.py DIR

metadata.json as it is; common.pt loaded as load_torch_checkpoint.py loads it (PyTorch's
weights_only globals and argparse.Namespace only); the distributed checkpoint by PyTorch's
FileSystemReader: its Metadata (read_metadata, pickle.load), then every tensor whole at its
global shape by load_state_dict without a process group, which reads each chunk's torch.save
blob from the range the metadata gives. The files name PyTorch 2.x's classes
(torch.distributed.checkpoint.metadata, ...); under 1.13 torch_distributed_checkpoint.py's
CheckpointReader looks them up where 1.13 keeps them.

The JSON: {"config": metadata.json, "common": common.pt (load_torch_checkpoint.py's JSON),
"tensors": {key: {"dtype", "shape", "chunks": [[offsets, sizes], ...], "values"}},
"objects": [keys of the objects stored as bytes], "planner_data": {key: path}}.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
import torch_distributed_checkpoint as dcp  # noqa: E402
from load_torch_checkpoint import as_json, load  # noqa: E402

def main():
    directory = sys.argv[1]
    with open(os.path.join(directory, "metadata.json")) as file:
        config = json.load(file)
    common, _ = load(os.path.join(directory, "common.pt"))
    reader = dcp.CheckpointReader(directory)
    metadata = reader.read_metadata()
    state, objects = {}, []
    for key, item in metadata.state_dict_metadata.items():
        if hasattr(item, "size"):
            state[key] = torch.empty(tuple(item.size), dtype=item.properties.dtype)
        else:
            objects.append(key)
    dcp.load_state_dict(state, reader, no_dist=True)
    tensors = {}
    for key, tensor in state.items():
        item = metadata.state_dict_metadata[key]
        tensors[key] = {"dtype": str(tensor.dtype), "shape": list(tensor.shape),
                        "chunks": [[list(c.offsets), list(c.sizes)] for c in item.chunks],
                        "values": tensor.float().flatten().tolist()}
    planner_data = {k: list(v) for k, v in (metadata.planner_data or {}).items()}
    json.dump({"config": config, "common": as_json(common), "tensors": tensors,
               "objects": objects, "planner_data": planner_data}, sys.stdout)


if __name__ == "__main__":
    main()
