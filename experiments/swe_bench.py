"""The paper's coding setting (SAO §4, SWE-bench Verified): an OpenHands-style agent, up to 300 turns.

Qwen3-30B-A3B from a path you give, DIS (0.8, 3.0), K = 2 frozen-attention critic updates, batch 128
single rollouts, rollouts from SGLang hosts, SWE-bench-format tasks from a jsonl file judged in the
sandbox (`env.runtime='local'`) or in the SWE-bench docker images (`env.runtime='docker'`).

  make train EXP=swe_bench ARGS="--config.model.path=/ckpt/qwen3-30b-a3b \\
      --config.rollout.urls=http://sglang-0:30000 --config.data.path=/data/swe_verified.jsonl \\
      --config.env.runtime=docker"
  make train EXP=swe_bench:algo=grpo_dis   # the GRPO+DIS baseline
  make train EXP=swe_bench:cpu             # minutes on a laptop: tiny model on the packaged tasks
                                           # generated from boltons (python -m sao_jax.envs.swe_gen)
"""

from sao_jax import config as config_lib


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, algo="sao", cpu=False, seed=0)
  c = config_lib.base_config()
  config_lib.apply_algo(c, arg.algo)
  c.seed = arg.seed
  # Async workers deliver single trajectories; group algorithms (GRPO, RLOO) run synchronously.
  c.mode = "async" if c.group_size == 1 else "sync"
  c.total_steps = 400
  c.batch_size = 128
  if c.group_size > 1:
    c.group_size = 8
  c.max_seq_len = 131072
  c.loss.eps_low, c.loss.eps_high = 0.8, 3.0
  c.optim.policy.lr = 1e-6
  c.optim.critic.lr, c.optim.critic.warmup_steps = 5e-6, 10
  c.model.preset = "qwen3_30b_a3b"
  c.model.tokenizer = "model"
  c.model.dtype = c.model.param_dtype = "bfloat16"
  c.model.remat = True
  c.env.name = "swe"
  c.env.tool_format = "qwen3"
  c.env.max_turns = 300
  c.env.timeout_s = 120.0
  c.env.memory_mb = 4096
  c.env.max_observation_chars = 8000
  c.env.runtime = "local"
  c.data.source = "swe_jsonl"
  c.data.num_eval = 50
  c.eval_every = 50
  c.checkpoint_every = 10
  c.rollout.engine = "http"
  c.rollout.max_new_tokens = 4096
  c.rollout.concurrency = 256
  c.mesh.data, c.mesh.fsdp = 1, -1
  if arg.cpu:
    _cpu(c)
  return c


def _cpu(c):
  """Laptop scale: the tiny byte-level model on the packaged boltons tasks, a few turns each.

  A model this small does not solve SWE tasks (rewards are ~0); the variant exercises the whole
  agentic pipeline (tools, sandbox, long observations, multi-turn trajectories) in minutes.
  """
  c.mode = "sync"
  c.total_steps = 6
  c.batch_size = 8 if c.group_size == 1 else 2 * c.group_size
  c.max_seq_len = 2048
  c.model.preset, c.model.tokenizer, c.model.path = "tiny", "byte", ""
  c.model.dtype = c.model.param_dtype = "float32"
  c.model.remat = False
  c.env.tool_format, c.env.max_turns = "compact", 3
  c.env.timeout_s, c.env.memory_mb, c.env.max_observation_chars = 60.0, 2048, 400
  c.data.path, c.data.num_eval = "", 4
  c.eval_every, c.checkpoint_every = 0, 0
  c.rollout.engine, c.rollout.max_new_tokens, c.rollout.concurrency = "embedded", 96, 8
  c.rollout.num_slots = 8
  c.loss.critic_only_steps = 1
  c.optim.policy.lr, c.optim.critic.lr = 1e-4, 5e-4
  c.mesh.data, c.mesh.fsdp = 1, 1
