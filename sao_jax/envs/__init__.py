"""Environments: protocol, sandboxed tools, task families and reward functions.

    factory = envs.make(config.env)      # once per run
    env = factory()                      # a fresh Env per episode
    messages = env.reset(task)           # task: a record from sao_jax.data
    result = env.step(action_text)       # StepResult(observation, reward, done, info)

Registered names: 'math_tool' (math with a Python tool), 'swe' (coding agent on SWE-bench-format
tasks), 'humaneval' (write -> test -> retry), 'style' (online writing-style simulation).
`demonstration(task, tool_format)` returns a correct chat trace for any task family (SFT).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sao_jax.envs import humaneval, math_tool, style, swe
from sao_jax.envs.base import Env, StepResult, ToolEnv, format_result, truncate_middle
from sao_jax.envs.sandbox import SandboxResult, isolation, run_command, run_python
from sao_jax.envs.tools import Tool, ToolCall, parse_action, render_call, tools_prompt

_REGISTRY: dict[str, Callable[..., Env]] = {}


def register(name: str, constructor: Callable[..., Env]):
  """Registers an environment constructor (called with the env config's fields as keywords)."""
  _REGISTRY[name] = constructor


register("math_tool", math_tool.MathToolEnv)
register("swe", swe.SweEnv)
register("humaneval", humaneval.HumanEvalEnv)
register("style", style.StyleEnv)

# Fields of config.env every environment understands, with defaults for configs that lack them.
_DEFAULTS = dict(
  max_turns=4,
  tool_format="compact",
  timeout_s=5.0,
  memory_mb=512,
  max_observation_chars=2000,
  runtime="local",
  style_switch_steps=(150, 300),
  style_judge="local",
  style_topic_check=True,
  judge_url="",
  judge_model="default",
)


class EnvFactory:
  """Makes fresh episodes of one configured environment.

  Attributes:
    name: the environment name.
    schedule: the style simulation's shared StyleSchedule (used by 'style' only).
  """

  def __init__(self, name: str, kwargs: dict[str, Any]):
    self.name, self.kwargs = name, kwargs
    self.schedule = style.StyleSchedule(tuple(kwargs.pop("style_switch_steps")))
    self.judge = None
    if name == "style" and kwargs["style_judge"] == "llm":
      from sao_jax.envs import judges

      self.judge = judges.LLMStyleJudge(kwargs["judge_url"], kwargs["judge_model"])
    elif kwargs["style_judge"] not in ("local", "llm"):
      raise ValueError(f"env.style_judge: must be 'local' or 'llm', got {kwargs['style_judge']!r}")

  def set_step(self, step: int):
    """Tells step-dependent environments (style) the current training step."""
    self.schedule.set_step(step)

  def __call__(self) -> Env:
    extra = dict(schedule=self.schedule, judge=self.judge) if self.name == "style" else {}
    return _REGISTRY[self.name](**self.kwargs, **extra)


def make(env_config) -> EnvFactory:
  """The factory of the environment `env_config` (config.env) describes.

  Args:
    env_config: a ConfigDict or dict with 'name' and any of the fields in `_DEFAULTS`.

  Returns:
    An EnvFactory: call it for a fresh per-episode Env.
  """
  fields = dict(env_config.items()) if hasattr(env_config, "items") else dict(env_config)
  name = fields.pop("name")
  if name not in _REGISTRY:
    raise ValueError(f"env.name: unknown environment {name!r}; known: {sorted(_REGISTRY)}")
  return EnvFactory(name, {**_DEFAULTS, **fields})


def demonstration(
  task: dict[str, Any], tool_format: str = "compact", *, style_sentences: int = 3
) -> list[dict[str, str]]:
  """A correct trace of `task` as chat messages (for SFT), whatever its family.

  Args:
    task: a record from sao_jax.data (math, HumanEval, SWE or style).
    tool_format: 'qwen3' or 'compact'.
    style_sentences: sentences per paragraph of a style demonstration (1-4).

  Returns:
    Chat messages (system, user, assistant/tool turns, final assistant turn); every tool
    observation equals what the environment returns for that call.
  """
  if "instance_id" in task:
    return swe.demonstration(task, tool_format)
  if "entry_point" in task:
    return humaneval.demonstration(task, tool_format)
  if "topic" in task:
    return style.demonstration(task, tool_format, sentences=style_sentences)
  return math_tool.demonstration(task, tool_format)


__all__ = [
  "Env",
  "EnvFactory",
  "SandboxResult",
  "StepResult",
  "Tool",
  "ToolCall",
  "ToolEnv",
  "demonstration",
  "format_result",
  "isolation",
  "make",
  "parse_action",
  "register",
  "render_call",
  "run_command",
  "run_python",
  "tools_prompt",
  "truncate_middle",
]
