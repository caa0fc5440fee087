"""The paper's online-learning simulation (§3.5): the preferred writing style switches over time.

The policy writes a short paragraph per prompt; reward = r_quality x r_style. The preferred style
switches cute -> chuunibyou -> classical at `env.style_switch_steps` (an academic distractor in the
pool). The comparison is SAO (state-dependent critic baseline) vs the running-mean baseline (window
128): after a switch the running mean lags, the critic adapts. The judge is a deterministic local
feature judge by default, or an LLM at an OpenAI-compatible endpoint (`env.style_judge='llm'`,
`env.judge_url=http://.../v1`).

  make train EXP=online_style ARGS="--config.model.path=/ckpt/qwen3-30b-a3b \\
      --config.rollout.urls=http://sglang-0:30000"
  make train EXP=online_style:algo=running_mean
  make train EXP=online_style:cpu            # minutes on a laptop (tiny model, switches at 30/60)
  make train EXP=online_style:cpu,algo=running_mean
"""

from sao_jax import config as config_lib


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, algo="sao", cpu=False, seed=0)
  c = config_lib.base_config()
  config_lib.apply_algo(c, arg.algo)
  c.seed = arg.seed
  # Async workers deliver single trajectories; group algorithms (GRPO, RLOO) run synchronously.
  c.mode = "async" if c.group_size == 1 else "sync"
  c.total_steps = 450
  c.batch_size = 128
  if c.group_size > 1:
    c.group_size = 8
  c.max_seq_len = 4096
  c.loss.eps_low, c.loss.eps_high = 0.3, 5.0
  c.optim.policy.lr = 1e-6
  c.optim.critic.lr, c.optim.critic.warmup_steps = 5e-6, 10
  c.model.preset = "qwen3_30b_a3b"
  c.model.tokenizer = "model"
  c.model.dtype = c.model.param_dtype = "bfloat16"
  c.env.name = "style"
  c.env.max_turns = 1
  c.env.style_switch_steps = (150, 300)
  c.data.source = "style"
  c.data.num_eval = 32
  c.eval_every = 25
  c.rollout.engine = "http"
  c.rollout.max_new_tokens = 512
  c.mesh.data, c.mesh.fsdp = 1, -1
  if arg.cpu:
    _cpu(c)
  return c


def _cpu(c):
  """Laptop scale: the tiny byte-level model, SFT on paragraphs of every style, switches at 30/60."""
  c.mode = "sync"
  c.total_steps = 90
  c.batch_size = 16 if c.group_size == 1 else 2 * c.group_size
  c.max_seq_len = 320
  c.env.style_switch_steps = (30, 60)
  c.model.preset, c.model.tokenizer, c.model.path = "tiny", "byte", ""
  c.model.dtype = c.model.param_dtype = "float32"
  # One-sentence paragraphs: the tiny model garbles longer ones (at 3 sentences, 800 SFT steps,
  # 38 of 48 sampled paragraphs failed the quality check).
  c.env.style_sentences = 1
  # Nor does it learn to copy the topic from the prompt (800 SFT steps: fluent sentences about
  # the wrong topic), so quality here means a fluent paragraph; the style preference is the point.
  c.env.style_topic_check = False
  c.rollout.engine, c.rollout.max_new_tokens = "embedded", 128
  c.loss.critic_only_steps = 5
  # Policy lr 3e-4 wrecked fluency within 30 steps (quality 0.74 -> 0.23, entropy up; seed 0).
  c.optim.policy.lr, c.optim.critic.lr = 1e-4, 5e-4
  # At 300 steps, lr 1e-3 every RL rollout scored 0; at 800 steps, lr 3e-3 the SFT NLL reaches
  # ~0.07 nats/byte.
  c.sft.steps, c.sft.lr = 800, 3e-3
  c.eval_every = 0
  c.mesh.data, c.mesh.fsdp = 1, 1
