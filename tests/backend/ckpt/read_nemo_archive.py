"""Reads a .nemo archive as NeMo's restore does, and prints it as JSON, for nemo_archive_test.cpp.

usage: read_nemo_archive.py FILE NEMO_TRAINING_CONFIG

tarfile opens it (NeMo's SaveRestoreConnector._unpack_nemo_file: "r:", else "r:gz"); OmegaConf
loads its model_config.yaml (OmegaConf.load, as restore_from does); the weights are loaded by
load_torch_checkpoint.py's restricted loader (torch.load with the weights_only globals). The
config is then merged into the `model` section of NEMO_TRAINING_CONFIG (a launcher training
config such as conf/training/gpt3/126m.yaml) with OmegaConf.merge, which fails on a value of
another type than NeMo's; "unknown_keys" lists the keys NeMo's model section does not have.

The JSON: {"members": [names], "config": {...}, "unknown_keys": [...], "merged": true,
"weights": [[name, {"shape", "values"}], ...] in the file's order}.
"""
import json
import os
import sys
import tarfile

from omegaconf import OmegaConf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import load_torch_checkpoint  # noqa: E402


def keys(config, prefix=""):
    out = []
    for key, value in config.items():
        name = prefix + str(key)
        out.append(name)
        if isinstance(value, dict):
            out.extend(keys(value, name + "."))
    return out


def main():
    path, training = sys.argv[1], sys.argv[2]
    try:
        tar = tarfile.open(path, "r:")
    except tarfile.ReadError:
        tar = tarfile.open(path, "r:gz")
    members = [m.name for m in tar.getmembers()]
    directory = os.path.join(os.path.dirname(os.path.abspath(path)), "unpacked")
    tar.extractall(directory)
    config = OmegaConf.load(os.path.join(directory, "model_config.yaml"))
    base = OmegaConf.load(training).model
    known = set(keys(OmegaConf.to_container(base, resolve=False)))
    ours = OmegaConf.to_container(config, resolve=False)
    OmegaConf.merge(base, config)
    state, _ = load_torch_checkpoint.load(os.path.join(directory, "model_weights.ckpt"))
    weights = [[name, {"shape": list(t.shape), "values": t.flatten().tolist()}]
               for name, t in state.items()]
    json.dump({"members": members, "config": ours,
               "unknown_keys": [k for k in keys(ours) if k not in known], "merged": True,
               "weights": weights}, sys.stdout)


if __name__ == "__main__":
    main()
