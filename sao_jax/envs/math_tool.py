"""Math with a Python tool (tool-integrated reasoning): prompts, answer checking, the environment.

The policy may run Python in the sandbox any number of times (up to `max_turns`) and ends with a
final answer in `\\boxed{...}`. Reward 1 iff the last boxed answer equals the task's answer:
integers by exact value (so '10,075' and '10075' agree), everything else through math-verify's
LaTeX/sympy equivalence ('\\frac{1}{2}' = '0.5', '2\\sqrt{2}' = '\\sqrt{8}').

Task records (sao_jax.data): {'id', 'problem', 'answer'} plus optional 'solution_code' (a program
whose output is the answer, used by demonstrations) and 'solution_output' (its exact stdout).

References: the SAO paper's reasoning setup (math + Python TIR, arXiv 2607.07508 §5).
"""

from __future__ import annotations

import re
import threading
from typing import Any, ClassVar

from sao_jax.envs import base, sandbox
from sao_jax.envs import tools as tools_lib

PYTHON_TOOL = tools_lib.Tool(
  name="python",
  description="run Python code; its printed output is returned",
  parameters={"code": {"type": "string", "description": "Python source code to run"}},
  required=("code",),
  compact_tag="py",
  compact_arg="code",
)

_COMPACT_SYSTEM = "Use <py>code</py> to run Python. Answer as \\boxed{x}."
_QWEN3_SYSTEM = (
  "Solve the problem. You can run Python code with the python tool; only what the code prints is "
  "returned. Put the final answer in \\boxed{}.\n\n"
)


# ------------------------------------------------------------------------------- answer checking
def extract_boxed(text: str) -> str | None:
  """The content of the last `\\boxed{...}` (or `\\fbox{...}`) in `text`, braces balanced."""
  starts = [m.end() for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text)]
  if not starts:
    return None
  depth, start = 1, starts[-1]
  for i in range(start, len(text)):
    depth += {"{": 1, "}": -1}.get(text[i], 0)
    if depth == 0:
      return text[start:i].strip()
  return None


def _as_int(s: str) -> int | None:
  s = re.sub(r"[\s$]|\\[,!; ]|\\text\{\s*\}", "", s).replace("{,}", "").rstrip(".")
  if re.fullmatch(r"[+-]?\d{1,3}(,\d{3})+", s):
    s = s.replace(",", "")
  return int(s) if re.fullmatch(r"[+-]?\d+", s) else None


def check_answer(pred: str | None, gold: str) -> bool:
  """True iff the predicted answer equals the gold answer.

  Args:
    pred: the predicted answer (the content of \\boxed{}), or None.
    gold: the reference answer (LaTeX or plain).

  Returns:
    Exact integer equality when both are integers, else math-verify equivalence.
  """
  if pred is None or not pred.strip():
    return False
  p, g = _as_int(pred), _as_int(str(gold))
  if p is not None and g is not None:
    return p == g
  import math_verify

  # math-verify's timeouts use SIGALRM, which only works in the main thread.
  timeout = 5 if threading.current_thread() is threading.main_thread() else None
  try:
    gold_p = math_verify.parse(f"${gold}$", parsing_timeout=timeout)
    pred_p = math_verify.parse(f"\\boxed{{{pred}}}", parsing_timeout=timeout)
    return bool(gold_p and pred_p and math_verify.verify(gold_p, pred_p, timeout_seconds=timeout))
  except Exception:
    return False


def score(text: str, gold: str) -> float:
  """1.0 if the last \\boxed{} answer in `text` equals `gold`, else 0.0."""
  return float(check_answer(extract_boxed(text), gold))


# ----------------------------------------------------------------------------------- environment
class MathToolEnv(base.ToolEnv):
  """Math problems with a sandboxed Python tool; reward 1 for a correct \\boxed{} answer."""

  name = "math_tool"
  tools: ClassVar = [PYTHON_TOOL]

  def __init__(self, *, timeout_s: float = 5.0, memory_mb: int = 512, **kwargs):
    super().__init__(**kwargs)
    self.timeout_s = timeout_s
    self.memory_mb = memory_mb

  def system_prompt(self) -> str:
    if self.tool_format == "compact":
      return _COMPACT_SYSTEM
    return _QWEN3_SYSTEM + tools_lib.tools_prompt(self.tools, self.tool_format)

  def user_prompt(self, task: dict[str, Any]) -> str:
    return task["problem"]

  def execute(self, call: tools_lib.ToolCall) -> str:
    r = sandbox.run_python(
      str(call.arguments["code"]),
      timeout_s=self.timeout_s,
      memory_mb=self.memory_mb,
      max_output_bytes=4 * self.max_observation_chars,
    )
    self.counts["tool_errors"] += not r.ok
    return base.format_result(r, timeout_s=self.timeout_s)

  def final_reward(self, text: str) -> tuple[float, dict[str, Any]]:
    pred = extract_boxed(text)
    if pred is None:
      return 0.0, dict(finish_reason="no_answer", pred="")
    return float(check_answer(pred, self.task["answer"])), dict(pred=pred)


def solution_output(task: dict[str, Any], timeout_s: float = 5.0) -> str:
  """The exact stdout of the task's solution code (from the record, else run in the sandbox)."""
  if "solution_output" in task:
    return task["solution_output"]
  r = sandbox.run_python(task["solution_code"], timeout_s=timeout_s)
  if not r.ok:
    raise ValueError(f"task {task.get('id')}: solution_code failed: {r.stderr[-500:]}")
  return r.stdout


def demonstration(task: dict[str, Any], tool_format: str) -> list[base.Message]:
  """A correct trace for SFT: one Python call (when the task has solution code), then the answer.

  Args:
    task: a math record; 'solution_code' makes a tool-using demonstration, otherwise the trace is a
      direct answer.
    tool_format: 'qwen3' or 'compact'.

  Returns:
    Chat messages: system, user, [assistant tool call, tool observation], assistant answer. The
    observation equals what MathToolEnv.step returns for that call.
  """
  env = MathToolEnv(tool_format=tool_format)
  messages = env.reset(task)
  if task.get("solution_code"):
    call = tools_lib.ToolCall("python", {"code": task["solution_code"]})
    out = solution_output(task)
    obs = base.format_result(
      sandbox.SandboxResult(out, "", 0, False, False, 0.0, "demo"), timeout_s=env.timeout_s
    )
    messages += [
      dict(role="assistant", content=tools_lib.render_call(call, env.tools, tool_format)),
      dict(role="tool", content=base.truncate_middle(obs, env.max_observation_chars)),
    ]
  answer = f"\\boxed{{{task['answer']}}}"
  final = answer if tool_format == "compact" else f"The answer is {answer}."
  return [*messages, dict(role="assistant", content=final)]
