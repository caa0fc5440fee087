"""One learner step under `jax.distributed` (run by test_multihost.py as N processes).

  python tests/multihost_step.py PROCESS_ID NUM_PROCESSES PORT OUT.json

Each process has 8 / N fake CPU devices; together they form one global 8-device mesh. Every process
builds the same tiny model and the same synthetic batch, feeds its own rows, runs one SAO step and
writes the loss and parameter checksums.
"""

import json
import os
import sys

pid, n, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={8 // n}"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
if n > 1:
  jax.distributed.initialize(f"localhost:{port}", n, pid)

from flax import nnx  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from sao_jax import config as config_lib  # noqa: E402
from sao_jax import models, sharding, testing, train_lib, train_step  # noqa: E402

config = testing.tiny_config("sao", batch_size=8, **{"mesh.data": -1, "loss.critic_only_steps": 0})
config_lib.validate(config, num_devices=jax.device_count())
mesh, rules = train_lib.make_mesh(config), sharding.rules_from(config)
policy = models.Policy(models.config_from(config.model), rngs=nnx.Rngs(0))
batch = testing.synthetic_batch(policy, batch_size=8, seq_len=24)  # on this host, unsharded
with sharding.use_mesh(mesh, rules):
  policy = sharding.shard_model(policy, mesh, rules)
  critic = train_lib.build_critic(config, policy)
  learner, state = train_step.init_state(config, policy, critic)
  state = train_lib.place_state(state, mesh)
  rows = slice(pid * 8 // n, (pid + 1) * 8 // n)
  batch_sharding = NamedSharding(mesh, P(("data", "fsdp")))
  local = {k: v[rows] for k, v in batch.items()}
  step = train_step.make_train_step(
    config, learner, state_sharding=train_lib.tree_shardings(state), batch_sharding=batch_sharding
  )
  state, metrics = step(state, train_lib.global_batch(local, batch_sharding))
  # Gather everything to every host before reading values.
  gathered = train_lib.host_values(
    jax.jit(lambda s: s, out_shardings=NamedSharding(mesh, P()))(
      {"policy": state.policy, "critic": state.critic, "m": metrics}
    )
  )
  leaves = jax.tree.leaves(gathered["policy"]) + jax.tree.leaves(gathered["critic"])
  result = {
    "policy_loss": float(gathered["m"]["policy/loss"]),
    "value_loss": float(gathered["m"]["critic/value_loss"]),
    "param_abs_sum": float(sum(np.abs(np.asarray(x)).sum() for x in leaves)),
    "num_devices": jax.device_count(),
    "num_processes": jax.process_count(),
  }
with open(out, "w") as f:
  json.dump(result, f)
