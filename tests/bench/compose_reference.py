"""OmegaConf 2.2 reference for the compose benchmark: load conf/config.yaml, the local cluster
and training/gpt3/126m, merge them as Hydra packages them, apply the same overrides and
resolve, NeMo's resolvers registered. This is the config work Hydra does before any job is
rendered (Hydra's own start-up comes on top). Prints the seconds one composition took."""
import sys
import time

start = time.perf_counter()
from omegaconf import OmegaConf  # noqa: E402  (import time is part of what users wait for)

conf = sys.argv[1]
OmegaConf.register_new_resolver("multiply", lambda x, y: x * y, replace=True)
OmegaConf.register_new_resolver("divide_ceil", lambda x, y: -(-x // y), replace=True)
OmegaConf.register_new_resolver("divide_floor", lambda x, y: x // y, replace=True)
primary = OmegaConf.load(f"{conf}/config.yaml")
primary.pop("defaults")
primary.pop("hydra")
cluster = OmegaConf.create({"cluster": OmegaConf.load(f"{conf}/cluster/local.yaml")})
training = OmegaConf.create({"training": OmegaConf.load(f"{conf}/training/gpt3/126m.yaml")})
config = OmegaConf.merge(primary, cluster, training)
config.launcher_scripts_path = "/opt/launcher"
config.base_results_dir = "/tmp/compose_bench"
resolved = OmegaConf.to_container(config, resolve=True)
OmegaConf.to_yaml(OmegaConf.create(resolved))
print(f"{time.perf_counter() - start:.4f}")
