"""Engines and agent loops from a run config (`config.rollout`, `config.env`, `config.max_seq_len`).

engine = rollout.make_engine(config, policy)          # embedded Engine, or HttpEngine for 'http'
loop = rollout.make_agent(config, engine, tokenizer)  # AgentLoop on envs.make(config.env)
"""

from __future__ import annotations

from typing import Any

from sao_jax.rollout.agent import AgentLoop, AgentSettings
from sao_jax.rollout.protocol import GenerateEngine


def make_engine(config: Any, policy: Any = None, *, version: int = 0) -> GenerateEngine:
  """The rollout engine `config.rollout.engine` names.

  Args:
    config: a run config.
    policy: the `models.Policy` (or `(graphdef, state)`) an embedded engine samples from; its
      weights are copied, so later training does not touch them until `update_weights`.
    version: the weight version of `policy` (or of the HTTP servers' current weights).

  Returns:
    An `Engine` with `config.rollout.num_slots` slots and room for `config.max_seq_len` tokens, or
    an `HttpEngine` on `config.rollout.urls`.
  """
  r = config.rollout
  if r.engine == "http":
    from sao_jax.rollout.http_client import HttpEngine

    return HttpEngine(r.urls, version=version)
  if r.engine != "embedded":
    raise ValueError(f"config.rollout.engine: must be 'embedded' or 'http', got {r.engine!r}")
  if policy is None:
    raise ValueError("make_engine: an embedded engine needs the policy")
  from sao_jax.config import int_list
  from sao_jax.rollout.engine import Engine

  windows = int_list(r.decode_windows)  # validated by config.validate
  return Engine(policy, num_slots=r.num_slots, max_len=config.max_seq_len,
                decode_windows=windows or None, seed=config.seed, version=version)  # fmt: skip


def make_agent(
  config: Any, engine: GenerateEngine, tokenizer: Any, env_factory: Any = None, *, evaluation=False
) -> AgentLoop:
  """An AgentLoop on `envs.make(config.env)` (or `env_factory`) with the config's settings.

  Args:
    config: a run config.
    engine: from `make_engine`.
    tokenizer: a `models.Tokenizer`.
    env_factory: overrides `envs.make(config.env)` (e.g. to share the style schedule).
    evaluation: sample with `config.eval.temperature` (0 = greedy), no top-p/top-k.
  """
  if env_factory is None:
    from sao_jax import envs

    env_factory = envs.make(config.env)
  settings = AgentSettings.from_config(config, evaluation=evaluation)
  return AgentLoop(engine, tokenizer, env_factory, settings)
