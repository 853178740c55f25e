"""Loads a torch.save file as PyTorch's weights_only loader would, and prints it as JSON.

usage: load_torch_checkpoint.py FILE

For torch_checkpoint_writer_test.cpp. With a PyTorch that has torch.serialization.
add_safe_globals (2.4 and later), torch.load(FILE, weights_only=True) after adding
argparse.Namespace to the safe globals, as Megatron-LM does for its own checkpoints. Older ones
(Debian bookworm's 1.13) have a weights_only loader that reads no floats at all, so there the
file is loaded by torch.load with a pickle module whose Unpickler resolves only the globals the
weights_only loader allows (collections.OrderedDict, torch._utils._rebuild_tensor_v2, the
storage classes, the dtypes) and argparse.Namespace: any other global fails the load.

The JSON: "bad_entry", the first entry whose CRC-32 is wrong (null: none), "loader", and
"value", with a tensor as {"tensor": dtype, "shape": [...], "values": [...]}, a Namespace as
{"namespace": {...}}, an OrderedDict as {"ordered_dict": [[key, value], ...]}, a dict as
{"dict": [[key, value], ...]} (keys may be integers), a tuple as {"tuple": [...]}, a dtype as
{"dtype": "torch.float32"}, a list as a list, and the scalars as themselves.
"""
import argparse
import collections
import json
import pickle
import sys
import zipfile

import torch


def allowed_globals():
    allowed = {("collections", "OrderedDict"): collections.OrderedDict,
               ("argparse", "Namespace"): argparse.Namespace,
               ("torch._utils", "_rebuild_tensor_v2"): torch._utils._rebuild_tensor_v2}
    for storage in torch._storage_classes:
        allowed[(storage.__module__, storage.__name__)] = storage
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
                  torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool):
        allowed[("torch", str(dtype).split(".")[1])] = dtype
    return allowed


class RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        found = allowed_globals().get((module, name))
        if found is None:
            raise pickle.UnpicklingError(f"global {module}.{name} is not allowed")
        return found


class RestrictedPickleModule:
    Unpickler = RestrictedUnpickler
    load = pickle.load
    __name__ = "restricted_pickle"


def load(path):
    if hasattr(torch.serialization, "add_safe_globals"):
        torch.serialization.add_safe_globals([argparse.Namespace])
        return torch.load(path, weights_only=True), "weights_only"
    return torch.load(path, pickle_module=RestrictedPickleModule), "restricted find_class"


def as_json(value):
    if isinstance(value, torch.Tensor):
        return {"tensor": str(value.dtype), "shape": list(value.shape),
                "values": value.float().flatten().tolist() if value.is_floating_point()
                else value.flatten().tolist()}
    if isinstance(value, torch.dtype):
        return {"dtype": str(value)}
    if isinstance(value, argparse.Namespace):
        return {"namespace": {k: as_json(v) for k, v in vars(value).items()}}
    if isinstance(value, collections.OrderedDict):
        return {"ordered_dict": [[as_json(k), as_json(v)] for k, v in value.items()]}
    if isinstance(value, dict):
        return {"dict": [[as_json(k), as_json(v)] for k, v in value.items()]}
    if isinstance(value, tuple):
        return {"tuple": [as_json(v) for v in value]}
    if isinstance(value, list):
        return [as_json(v) for v in value]
    return value


def main():
    # Python's zipfile checks every entry's CRC-32 (torch.load itself does not).
    bad_entry = zipfile.ZipFile(sys.argv[1]).testzip()
    value, how = load(sys.argv[1])
    json.dump({"loader": how, "bad_entry": bad_entry, "value": as_json(value)}, sys.stdout)


if __name__ == "__main__":
    main()
