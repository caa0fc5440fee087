"""The algorithms sao_jax runs, and the knob defaults each one sets.

An `Algo` says which advantage estimator and policy loss the train step uses, whether a critic is
trained, and whether prompts are sampled in groups. `config.apply_algo(config, name)` writes its
defaults into the config; a researcher can then override any knob (`--config.loss.critic_steps=3`).
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class Algo:
  """One algorithm variant.

  Attributes:
    advantage: 'skip_gae' (critic, skip-observation GAE), 'gae' (critic, plain token GAE),
      'grpo' (group-normalized outcome), 'rloo' (leave-one-out), 'running_mean' (r - mean of window).
    policy_loss: 'dis' (ratio against pi_rollout, masked band), 'ppo' (clip against the recomputed
      old policy), 'decoupled_ppo' (AReaL: proximal policy + behaviour weight).
    critic: trains a value model.
    needs_group: needs group_size >= 2.
    description: one line for tables and --help.
    defaults: knob values written by `config.apply_algo` ('section.field' -> value).
  """

  advantage: str
  policy_loss: str
  critic: bool
  needs_group: bool
  description: str
  defaults: dict[str, Any] = dataclasses.field(default_factory=dict)


_SAO = {
  "loss.critic_steps": 2,
  "loss.length_adaptive": True,
  "loss.lam_alpha": 1.5,
  "loss.lam_critic": 1.0,
  "critic.frozen_attention": True,
  "group_size": 1,
}

ALGOS: dict[str, Algo] = {
  "sao": Algo(
    "skip_gae",
    "dis",
    True,
    False,
    "SAO: single rollout, DIS, K=2 frozen-attention critic, decoupled length-adaptive lambda",
    _SAO,
  ),
  "sao_dis_only": Algo(
    "skip_gae",
    "dis",
    True,
    False,
    "single rollout + DIS with a plain critic (K=1, full-parameter, no decoupled lambda)",
    {
      **_SAO,
      "loss.critic_steps": 1,
      "critic.frozen_attention": False,
      "loss.length_adaptive": False,
      "loss.lam_policy": 1.0,
    },
  ),
  "sao_no_faster_value": Algo(
    "skip_gae",
    "dis",
    True,
    False,
    "SAO ablation: K=1 critic update per policy update",
    {**_SAO, "loss.critic_steps": 1},
  ),
  "sao_no_frozen_attention": Algo(
    "skip_gae",
    "dis",
    True,
    False,
    "SAO ablation: full-parameter critic",
    {**_SAO, "critic.frozen_attention": False},
  ),
  "running_mean": Algo(
    "running_mean",
    "dis",
    False,
    False,
    "single rollout, A = r - mean of the last 128 rewards, DIS",
    {"group_size": 1, "loss.baseline_window": 128},
  ),
  "grpo": Algo(
    "grpo",
    "ppo",
    False,
    True,
    "GRPO: G samples per prompt, PPO clip against the recomputed old policy",
    {"group_size": 8, "loss.clip_low": 0.2, "loss.clip_high": 0.28},
  ),
  "grpo_dis": Algo(
    "grpo", "dis", False, True, "GRPO advantages with the DIS loss", {"group_size": 8}
  ),
  "rloo": Algo(
    "rloo",
    "ppo",
    False,
    True,
    "RLOO: leave-one-out baseline, PPO clip",
    {"group_size": 8, "loss.clip_low": 0.2, "loss.clip_high": 0.28},
  ),
  "ppo": Algo(
    "gae",
    "ppo",
    True,
    False,
    "PPO: token GAE (lambda 0.95), clip 0.2 against the recomputed old policy",
    {
      "group_size": 1,
      "loss.critic_steps": 1,
      "loss.length_adaptive": False,
      "loss.lam_policy": 0.95,
      "loss.lam_critic": 0.95,
      "loss.clip_low": 0.2,
      "loss.clip_high": 0.2,
      "critic.frozen_attention": False,
      "loss.critic_only_steps": 0,
    },
  ),
  "decoupled_ppo": Algo(
    "skip_gae",
    "decoupled_ppo",
    True,
    False,
    "AReaL decoupled PPO: proximal policy, behaviour weight masked above the cap",
    {
      "group_size": 1,
      "loss.critic_steps": 1,
      "loss.clip_low": 0.2,
      "loss.clip_high": 0.2,
      "critic.frozen_attention": False,
      "loss.behav_cap": 5.0,
    },
  ),
  "vapo": Algo(
    "skip_gae",
    "ppo",
    True,
    False,
    "VAPO: decoupled + length-adaptive GAE (alpha 0.05), clip-higher, positive NLL, no DIS",
    {
      "group_size": 1,
      "loss.critic_steps": 1,
      "loss.length_adaptive": True,
      "loss.lam_alpha": 0.05,
      "loss.lam_critic": 1.0,
      "loss.clip_low": 0.2,
      "loss.clip_high": 0.28,
      "loss.nll_coef": 0.1,
      "critic.frozen_attention": False,
    },
  ),
}
