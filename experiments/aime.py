"""The paper's reasoning setting (SAO §4, Table 1): math with a Python tool, Qwen3-30B-A3B.

Batch 128 single rollouts, DIS (0.3, 5.0), K = 2 frozen-attention critic updates, policy LR 1e-6,
critic LR 5e-6 with 10 warm-up steps and 10 critic-only steps, 128k context, evaluation as mean
pass@1 over 16 samples. Weights come from a path you give (a Hugging Face Qwen3-30B-A3B directory,
SFT'd on tool-integrated reasoning traces as in the paper); rollouts from SGLang hosts.

  make train EXP=aime ARGS="--config.model.path=/ckpt/qwen3-30b-a3b-sft \\
      --config.rollout.urls=http://sglang-0:30000,http://sglang-1:30000 \\
      --config.data.path=/data/math_train.jsonl"
  make train EXP=aime:algo=grpo_dis        # a baseline: GRPO (16 prompts x 8 samples) + DIS
  make train EXP=aime:cpu                  # minutes on a laptop: tiny model, procedural tasks
"""

from sao_jax import config as config_lib


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, algo="sao", cpu=False, seed=0)
  c = config_lib.base_config()
  config_lib.apply_algo(c, arg.algo)
  c.seed = arg.seed
  # Async workers deliver single trajectories; group algorithms (GRPO, RLOO) run synchronously.
  c.mode = "async" if c.group_size == 1 else "sync"
  c.total_steps = 1000
  c.batch_size = 128
  if c.group_size > 1:
    c.group_size = 8  # 16 prompts x 8 samples = 128, as the paper's GRPO(+DIS) baselines
  c.max_seq_len = 131072
  c.loss.eps_low, c.loss.eps_high = 0.3, 5.0
  c.optim.policy.lr = 1e-6
  c.optim.critic.lr, c.optim.critic.warmup_steps = 5e-6, 10
  c.model.preset = "qwen3_30b_a3b"
  c.model.tokenizer = "model"
  c.model.dtype = c.model.param_dtype = "bfloat16"
  c.model.remat = True
  c.env.name = "math_tool"
  c.env.tool_format = "qwen3"
  c.env.max_turns = 32
  c.env.timeout_s = 10.0
  c.data.source = "jsonl"
  c.eval.num_samples = 16
  c.eval.temperature = 1.0
  c.eval_every = 50
  c.checkpoint_every = 25
  c.rollout.engine = "http"
  c.rollout.max_new_tokens = 16384
  c.rollout.concurrency = 256
  c.mesh.data, c.mesh.fsdp = 1, -1
  if arg.cpu:
    _cpu(c)
  return c


def _cpu(c):
  """Laptop scale: the quickstart's tiny model and procedural tasks, same algorithm knobs."""
  c.mode = "sync"
  c.total_steps = 40
  c.batch_size = 16 if c.group_size == 1 else 2 * c.group_size
  c.max_seq_len = 256
  c.model.preset, c.model.tokenizer, c.model.path = "tiny", "byte", ""
  c.model.dtype = c.model.param_dtype = "float32"
  c.model.remat = False
  c.env.tool_format, c.env.max_turns, c.env.timeout_s = "compact", 2, 5.0
  c.data.source, c.data.task = "procedural", "arith"
  c.eval.num_samples, c.eval.temperature = 1, 0.0
  c.eval_every, c.checkpoint_every = 20, 20
  c.rollout.engine, c.rollout.max_new_tokens, c.rollout.concurrency = "embedded", 48, 16
  c.optim.policy.lr, c.optim.critic.lr = 1e-4, 5e-4
  c.sft.steps = 300
  c.mesh.data, c.mesh.fsdp = 1, 1
