"""PyTorch's distributed checkpoint (DCP) API, as the test scripts import it: from
torch.distributed.checkpoint (PyTorch 2.x) or torch.distributed._shard.checkpoint (1.13,
Debian bookworm's), with the ShardedTensor construction both have."""
import os
import pickle

import torch  # noqa: F401


def import_sharded_tensor():
    """Debian's PyTorch 1.13 under Python 3.11 cannot import torch.distributed._shard: one
    dataclass field's default is a TensorProperties() instance, which Python 3.11 refuses as a
    mutable default. PyTorch 2.0 made it a default_factory; while torch.distributed._shard is
    imported here, dataclasses.field makes that change for such a default."""
    import copy
    import dataclasses
    original = dataclasses.field

    def field(*args, **kwargs):
        default = kwargs.get("default", dataclasses.MISSING)
        if dataclasses.is_dataclass(default) and type(default).__hash__ is None:
            del kwargs["default"]
            kwargs["default_factory"] = lambda: copy.deepcopy(default)
        return original(*args, **kwargs)
    dataclasses.field = field
    try:
        import torch.distributed._shard.sharded_tensor  # noqa: F401
    finally:
        dataclasses.field = original


import_sharded_tensor()
from torch.distributed._shard.sharded_tensor import Shard, init_from_local_shards  # noqa: E402,F401

try:  # PyTorch 2.x
    from torch.distributed.checkpoint import (FileSystemReader, FileSystemWriter,  # noqa: F401
                                              load_state_dict, save_state_dict)
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
    from torch.distributed.checkpoint.planner import WriteItemType
except ImportError:  # PyTorch 1.13
    from torch.distributed._shard.checkpoint import (FileSystemReader,  # noqa: F401
                                                     FileSystemWriter, load_state_dict,
                                                     save_state_dict)
    from torch.distributed._shard.checkpoint.default_planner import DefaultSavePlanner
    from torch.distributed._shard.checkpoint.planner import WriteItemType


class MCoreSavePlanner(DefaultSavePlanner):
    """Megatron core's planner (strategies/torch.py's MCoreSavePlanner): every rank writes its
    own objects (the default planner writes objects on the coordinator only), and an object is
    the io.BytesIO given, not torch.save'd again."""

    def create_local_plan(self):
        self.is_coordinator = True
        return super().create_local_plan()

    def transform_object(self, write_item, object):
        if write_item.type == WriteItemType.BYTE_IO:
            return object
        return super().transform_object(write_item, object)


# PyTorch 2.x's module names → 1.13's, for the classes of a DCP .metadata.
RENAMED = {
    ("torch.distributed.checkpoint.metadata", "TensorProperties"):
        ("torch.distributed._shard.sharded_tensor.metadata", "TensorProperties"),
    ("torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING"):
        ("torch.distributed._shard.sharded_tensor.metadata", "MEM_FORMAT_ENCODING"),
}


class MetadataUnpickler(pickle.Unpickler):
    """pickle's Unpickler, which under PyTorch 1.13 finds PyTorch 2.x's DCP classes where 1.13
    keeps them (torch.distributed._shard); nothing else is renamed."""

    def find_class(self, module, name):
        try:
            return super().find_class(module, name)
        except ModuleNotFoundError:
            if not module.startswith("torch.distributed.checkpoint."):
                raise
            module, name = RENAMED.get(
                (module, name),
                (module.replace("torch.distributed.checkpoint.",
                                "torch.distributed._shard.checkpoint."), name))
            return super().find_class(module, name)


class CheckpointReader(FileSystemReader):
    """FileSystemReader whose metadata loads under either PyTorch, whichever wrote it."""

    def read_metadata(self):
        with open(os.path.join(self.path, ".metadata"), "rb") as file:
            return MetadataUnpickler(file).load()
