"""Quickstart, the CPU default: a tiny Qwen3-style model learns to use a Python tool with SAO.

A ~90k-parameter byte-level model is first SFT'd on demonstrations of a procedural arithmetic task
(`347*29+12`): half of them call the tool (`<py>print(347*29+12)</py>`, then `\\boxed{10075}` from
its output), half state an answer directly, as a weaker teacher would. After SFT the greedy policy
mostly answers directly, and mostly wrongly; RL (SAO: single rollouts, DIS, a K = 2
frozen-attention critic) discovers that the tool pays. The closing summary prints eval pass@1
after SFT and after RL. About 6 minutes on 2 CPU cores.

  make train                                  # = EXP=quickstart
  make train EXP=quickstart:algo=grpo         # any algorithm in sao_jax.algos
  make train EXP=quickstart:steps=80,seed=1
  python -m sao_jax.train --config=experiments/quickstart.py:algo=sao --workdir=runs/qs
"""

from sao_jax import config as config_lib


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, algo="sao", steps=40, seed=0)
  c = config_lib.base_config()
  config_lib.apply_algo(c, arg.algo)
  c.seed = arg.seed
  c.total_steps = arg.steps
  # 16 single rollouts, or 2 prompts x 8 samples for the group algorithms (equal samples).
  c.batch_size = 16 if c.group_size == 1 else 2 * c.group_size
  c.max_seq_len = 256
  c.eval_every = 10
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
  c.sft.steps = 700
  c.sft.lr = 3e-3
  c.sft.tool_fraction = 0.5
  return c
