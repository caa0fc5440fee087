"""The environment protocol and a multi-turn tool-using base class.

An episode: `messages = env.reset(task)` (chat messages: a system prompt that explains the tools,
then the task), then `env.step(action_text)` once per policy turn until `done`. `observation` is the
raw tool output text; the agent loop wraps it in the chat template's tool-response framing (for
Qwen3, `<tool_response>...</tool_response>` inside a 'tool' turn), so environments never add it.

`ToolEnv` runs the loop every tool environment shares: parse the action (tools.py), execute each
call, report malformed calls as an observation, count turns and errors, and end the episode on a
final answer, a submit, or `max_turns`. `info` always carries 'finish_reason' ('answer',
'no_answer', 'submit', 'max_turns'), 'turns', 'tool_calls', 'tool_errors' and 'format_errors'.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, ClassVar

from sao_jax.envs import tools as tools_lib
from sao_jax.envs.sandbox import SandboxResult

Message = dict[str, str]


@dataclasses.dataclass
class StepResult:
  """Result of one policy turn.

  Attributes:
    observation: tool output text for the next turn, or None when the episode is over.
    reward: outcome reward (0 until the final step).
    done: the episode is over.
    info: finish reason, turn and error counters, environment-specific details.
  """

  observation: str | None
  reward: float
  done: bool
  info: dict[str, Any]


class Env(abc.ABC):
  """One episode of an environment (create a fresh one per episode)."""

  name: str = "env"

  @abc.abstractmethod
  def reset(self, task: dict[str, Any]) -> list[Message]:
    """Starts an episode on `task` (a data record) and returns the initial chat messages."""

  @abc.abstractmethod
  def step(self, action_text: str) -> StepResult:
    """Applies one policy turn and returns what the environment answers."""

  def close(self):
    """Releases per-episode resources (workspaces, containers); safe to call more than once.

    Episodes that end release them by themselves; call this for an episode abandoned midway.
    """
    return None


def truncate_middle(text: str, max_chars: int) -> str:
  """Keeps the head and tail of `text` within `max_chars`, saying how much was cut."""
  if max_chars <= 0 or len(text) <= max_chars:
    return text
  note = f"\n[... {len(text) - max_chars} characters truncated ...]\n"
  keep = max(max_chars - len(note), 0)
  head = keep * 2 // 3
  return text[:head] + note + text[len(text) - (keep - head) :]


def format_result(r: SandboxResult, *, timeout_s: float) -> str:
  """The observation text of a sandboxed run: stdout, then stderr, then a status note.

  Deterministic in the run's outputs, so demonstrations can build the same text without running.
  """
  text = r.stdout + r.stderr
  if r.truncated:
    text += "\n[output truncated]"
  if r.timed_out:
    text += f"\n[timed out after {timeout_s:g} s]"
  elif r.exit_code < 0:
    text += f"\n[killed by signal {-r.exit_code}]"
  text = text.strip("\n")
  return text if text else "[no output]"


class ToolEnv(Env):
  """Base class of multi-turn tool environments.

  Subclasses set `tools` and implement `system_prompt`, `user_prompt`, `execute` (one call to its
  observation text) and `final_reward` (the reward of a final answer without tool calls); they may
  override `submit_reward` and `max_turns_reward`.
  """

  tools: ClassVar[list[tools_lib.Tool]] = []
  submit_tool: str | None = None  # calling this tool ends the episode

  def __init__(
    self,
    *,
    max_turns: int = 4,
    tool_format: str = "qwen3",
    max_observation_chars: int = 2000,
    **unused,
  ):
    if tool_format not in tools_lib.FORMATS:
      raise ValueError(f"tool_format: must be one of {tools_lib.FORMATS}, got {tool_format!r}")
    if max_turns < 1:
      raise ValueError(f"max_turns: must be >= 1, got {max_turns}")
    self.max_turns = max_turns
    self.tool_format = tool_format
    self.max_observation_chars = max_observation_chars
    self.task: dict[str, Any] | None = None
    self.counts = {}
    self.turn = 0

  # Subclass hooks ----------------------------------------------------------------------------
  @abc.abstractmethod
  def system_prompt(self) -> str: ...

  @abc.abstractmethod
  def user_prompt(self, task: dict[str, Any]) -> str: ...

  @abc.abstractmethod
  def execute(self, call: tools_lib.ToolCall) -> str: ...

  @abc.abstractmethod
  def final_reward(self, text: str) -> tuple[float, dict[str, Any]]:
    """Runs one well-formed call and returns its observation text."""
    """The first user message of `task`."""
    """The system message: the task framing and the tools."""
    """Reward and details of a final answer (an action with no tool call)."""

  def submit_reward(self, call: tools_lib.ToolCall) -> tuple[float, dict[str, Any]]:
    """Reward and details when the policy calls the submit tool."""
    return 0.0, {}

  def max_turns_reward(self) -> tuple[float, dict[str, Any]]:
    """Reward and details when the turn budget runs out."""
    return 0.0, {}

  def on_reset(self, task: dict[str, Any]):
    """Per-episode setup (e.g. a workspace) before the prompts are built."""

  # Protocol ----------------------------------------------------------------------------------
  def reset(self, task: dict[str, Any]) -> list[Message]:
    """Starts an episode: counters to zero, per-episode setup, the two opening messages."""
    self.task, self.turn = task, 0
    self.counts = dict(tool_calls=0, tool_errors=0, format_errors=0)
    self.on_reset(task)
    return [
      dict(role="system", content=self.system_prompt()),
      dict(role="user", content=self.user_prompt(task)),
    ]

  def _info(self, finish_reason: str | None, extra: dict[str, Any]) -> dict[str, Any]:
    return dict(finish_reason=finish_reason, turns=self.turn, **self.counts, **extra)

  def step(self, action_text: str) -> StepResult:
    """Parses the action, runs its calls or scores its final answer (see the module docstring)."""
    if self.task is None:
      raise RuntimeError("step() before reset()")
    self.turn += 1
    parsed = tools_lib.parse_action(action_text, self.tools)
    if not parsed.calls and not parsed.errors:
      reward, extra = self.final_reward(action_text)
      reason = extra.pop("finish_reason", "answer")
      return StepResult(None, reward, True, self._info(reason, extra))
    self.counts["format_errors"] += len(parsed.errors)
    self.counts["tool_calls"] += len(parsed.calls)
    submit = [c for c in parsed.calls if c.name == self.submit_tool]
    if submit:
      reward, extra = self.submit_reward(submit[0])
      return StepResult(None, reward, True, self._info("submit", extra))
    if self.turn >= self.max_turns:  # no turn left to read the tool output
      reward, extra = self.max_turns_reward()
      return StepResult(None, reward, True, self._info("max_turns", extra))
    outputs = [f"Error: {e}" for e in parsed.errors]
    outputs += [self.execute(call) for call in parsed.calls]
    obs = truncate_middle("\n\n".join(outputs), self.max_observation_chars)
    return StepResult(obs, 0.0, False, self._info(None, {}))
