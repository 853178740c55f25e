"""Files torch.save writes, for tests/backend/ckpt/torch_checkpoint_test.cpp.

usage: write_torch_checkpoints.py DIR

Writes into DIR, with PyTorch itself (Debian's python3-torch):
  plain.pt      torch.save's default (pickle protocol 2): a dict as Megatron-LM's
                model_optim_rng.pt holds one (a state dict of tensors of every dtype, an
                argparse.Namespace of args, the iteration, the checkpoint version, the RNG state
                of Python, numpy and torch), plus views sharing a storage (a transpose, an
                offset slice) and plain values
  protocol4.pt  the same object with pickle_protocol=4 (FRAME, MEMOIZE, STACK_GLOBAL, ...)
  evil.pt       a dict holding an object whose unpickling would call os.system
  climbing.pt   plain.pt's entries plus one named plain/../../outside (zipfile writes it)
  symlink.pt    plain.pt's entries plus one that is a symbolic link
  expected.json what the reader must find: each tensor's dtype, shape and values (row-major),
                the args, and the plain values
"""
import argparse
import collections
import json
import os
import random
import sys
import zipfile

import numpy
import torch


class RunsCode:
    def __reduce__(self):
        return (os.system, ("echo this must never run",))


def main():
    out = sys.argv[1]
    torch.manual_seed(0)
    numpy.random.seed(0)
    random.seed(0)
    model = collections.OrderedDict()
    model["float32"] = torch.randn(2, 3)
    model["bfloat16"] = torch.randn(3).to(torch.bfloat16)
    model["float16"] = torch.randn(2, 2).to(torch.float16)
    model["float64"] = torch.randn(4, dtype=torch.float64)
    model["int64"] = torch.tensor([-(2**40), 3, 7])
    model["int32"] = torch.tensor([[1, -2], [3, 4]], dtype=torch.int32)
    model["int8"] = torch.tensor([-128, 127], dtype=torch.int8)
    model["uint8"] = torch.tensor([0, 255], dtype=torch.uint8)
    model["bool"] = torch.tensor([True, False, True])
    model["scalar"] = torch.tensor(2.5)
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    model["transposed"] = base.t()  # a view: stride (1, 4), same storage as "base"
    model["base"] = base
    model["slice"] = base[1:, 1:3]  # offset 5, stride (4, 1)
    args = argparse.Namespace(num_layers=2, hidden_size=32, lr=1e-3, tokenizer_type="GPT2BPETokenizer",
                              bf16=True, fp16=False, seed=None, data_path=["1.0", "corpus"],
                              params_dtype=torch.bfloat16)
    checkpoint = {
        "model": model,
        "args": args,
        "iteration": 7,
        "checkpoint_version": 3.0,
        "rng_state": [{
            "random_rng_state": random.getstate(),
            "np_rng_state": numpy.random.get_state(),
            "torch_rng_state": torch.get_rng_state(),
        }],
        "plain": {"big": 2**40, "negative": -5, "bytes": b"\x00\xff", "text": "pi ≈ 3.14",
                  "nested": [1, (2, "x"), {"k": None}], "ratio": 0.1},
    }
    torch.save(checkpoint, os.path.join(out, "plain.pt"))
    torch.save(checkpoint, os.path.join(out, "protocol4.pt"), pickle_protocol=4)
    torch.save({"model": model, "payload": RunsCode()}, os.path.join(out, "evil.pt"))
    for name, extra in (("climbing", zipfile.ZipInfo("plain/../../outside")),
                        ("symlink", zipfile.ZipInfo("plain/link"))):
        if name == "symlink":
            extra.external_attr = (0o120777 << 16)
        with zipfile.ZipFile(os.path.join(out, "plain.pt")) as source, \
                zipfile.ZipFile(os.path.join(out, name + ".pt"), "w") as archive:
            for item in source.infolist():
                archive.writestr(item, source.read(item))
            archive.writestr(extra, b"/etc/passwd")
    expected = {
        "tensors": {
            name: {"dtype": str(t.dtype), "shape": list(t.shape),
                   "values": [float(v) for v in t.flatten().tolist()]}
            for name, t in model.items()
        },
        "args": {"num_layers": 2, "hidden_size": 32, "lr": 1e-3,
                 "tokenizer_type": "GPT2BPETokenizer", "bf16": True, "fp16": False},
        "torch_rng_state_bytes": torch.get_rng_state().numel(),
        "np_rng_words": int(numpy.random.get_state()[1].size),
    }
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f)


if __name__ == "__main__":
    main()
