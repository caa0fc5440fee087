"""Quickstart: the CPU default. A tiny Qwen3-style model, SFT on demonstrations of a procedural
math-with-Python-tool task, then SAO.

  make train                                  # = EXP=quickstart
  make train EXP=quickstart:algo=grpo         # any algorithm in sao_jax.algos
  python -m sao_jax.train --config=experiments/quickstart.py:algo=sao --workdir=runs/qs
"""

from sao_jax import config as config_lib


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, algo="sao", steps=60, seed=0)
  c = config_lib.base_config()
  config_lib.apply_algo(c, arg.algo)
  c.seed = arg.seed
  c.total_steps = arg.steps
  c.batch_size = 16 if c.group_size == 1 else 2 * c.group_size
  c.max_seq_len = 256
  c.model.preset = "tiny"
  c.model.tokenizer = "byte"
  c.env.name = "math_tool"
  c.env.tool_format = "compact"
  c.env.max_turns = 2
  c.data.source = "procedural"
  c.data.task = "arith"
  c.rollout.max_new_tokens = 48
  c.optim.policy.lr = 1e-4
  c.optim.critic.lr = 5e-4
  c.sft.steps = 300
  return c
