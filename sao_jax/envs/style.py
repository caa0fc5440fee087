"""Online writing-style simulation: the preferred style switches during training.

After the SAO paper's §3.5: the policy writes a short paragraph for a prompt; the reward is
r_quality x r_style, both binary. The preferred style switches cute -> chuunibyou -> classical at
`switch_steps` (default 150 and 300); the judge's pool is {academic, cute, chuunibyou} in the first
two phases (academic is a distractor no phase prefers) and {classical, cute, chuunibyou} in the
third. A critic must track the moving reward, which is what separates SAO from a running-mean
baseline here.

The training step comes from `StyleSchedule.step`, which the env factory shares with every episode
(`factory.set_step(policy_version)`); a task may also pin it with a 'step' field.

References: SAO paper §3.5; algorithm.md §5 (online simulation).
"""

from __future__ import annotations

import dataclasses
import random
import threading
from typing import Any

from sao_jax.envs import base, judges

PHASES = ("cute", "chuunibyou", "classical")
POOLS = (
  ("academic", "cute", "chuunibyou"),
  ("academic", "cute", "chuunibyou"),
  ("classical", "cute", "chuunibyou"),
)
_SYSTEM = "You are a writer. Answer with one short paragraph."


@dataclasses.dataclass
class StyleSchedule:
  """Which style is preferred at a training step (thread-safe step counter)."""

  switch_steps: tuple[int, ...] = (150, 300)
  step: int = 0

  def __post_init__(self):
    if len(self.switch_steps) != len(PHASES) - 1 or list(self.switch_steps) != sorted(
      self.switch_steps
    ):
      raise ValueError(
        f"env.style_switch_steps: need {len(PHASES) - 1} increasing steps, got {self.switch_steps}"
      )
    self._lock = threading.Lock()

  def set_step(self, step: int):
    """Sets the current training step (shared by all episodes)."""
    with self._lock:
      self.step = int(step)

  def phase(self, step: int | None = None) -> int:
    """Phase index 0, 1 or 2 at `step` (default: the current step)."""
    s = self.step if step is None else step
    return sum(s >= t for t in self.switch_steps)

  def preferred(self, step: int | None = None) -> str:
    """The preferred style at `step`."""
    return PHASES[self.phase(step)]

  def pool(self, step: int | None = None) -> tuple[str, ...]:
    """The judge's style pool at `step`."""
    return POOLS[self.phase(step)]


class StyleEnv(base.Env):
  """One-turn writing task; reward = r_quality * r_style under the current preference.

  Args:
    schedule: the shared StyleSchedule (default: a private one).
    judge: a LocalStyleJudge or LLMStyleJudge (default: the local one).
    style_topic_check: the quality check also requires the prompt's topic to be mentioned; off,
      any fluent paragraph passes (for models too small to copy the topic from the prompt).
  """

  name = "style"

  def __init__(
    self, *, schedule: StyleSchedule | None = None, judge=None, style_topic_check=True, **unused
  ):
    self.schedule = schedule or StyleSchedule()
    self.judge = judge or _local_judge()
    self.topic_check = bool(style_topic_check)
    self.task = None

  def reset(self, task: dict[str, Any]) -> list[base.Message]:
    self.task = task
    return [dict(role="system", content=_SYSTEM), dict(role="user", content=task["prompt"])]

  def step(self, action_text: str) -> base.StepResult:
    if self.task is None:
      raise RuntimeError("step() before reset()")
    step = self.task.get("step", self.schedule.step)
    preferred, pool = self.schedule.preferred(step), self.schedule.pool(step)
    task = self.task if self.topic_check else {k: v for k, v in self.task.items() if k != "topic"}
    verdict = self.judge.judge(action_text, task=task, preferred=preferred, pool=pool)
    reward = verdict["r_quality"] * verdict["r_style"]
    info = dict(
      finish_reason="answer",
      turns=1,
      tool_calls=0,
      tool_errors=0,
      format_errors=0,
      preferred=preferred,
      phase=self.schedule.phase(step),
      **verdict,
    )
    return base.StepResult(None, reward, True, info)


_JUDGE_LOCK = threading.Lock()
_JUDGE: list[judges.LocalStyleJudge] = []


def _local_judge() -> judges.LocalStyleJudge:
  with _JUDGE_LOCK:  # fitted once per process (0.2 s)
    if not _JUDGE:
      _JUDGE.append(judges.LocalStyleJudge())
    return _JUDGE[0]


# ------------------------------------------------------------------------------- demonstrations
_TEMPLATES = {
  "cute": [
    "Aww, {t} is sooo sweet! I just wanna give it the biggest hug~",
    "Hehe, {t} makes me feel all cozy and happy inside! <3",
    "Yay! {T} is like a tiny fluffy friend saying hi! Teehee!",
    "Everything about {t} is so little and sparkly, I could squeal!!",
  ],
  "chuunibyou": [
    "Kukuku... {t} hides a sealed power that only I can sense!",
    "Behold, mortal! {T} is the herald of the Eternal Darkness!",
    "The Abyss whispers of {t}, and my cursed right arm trembles!",
    "Fools! {T} is no ordinary thing -- it is my destiny, forged in forbidden flame!",
  ],
  "classical": [
    "And {t} was upon the earth, and it was good in the sight of the LORD.",
    "Lo, {t} doth abide, and thou shalt behold it all thy days.",
    "Wherefore {t} hath been given unto thee; rejoice therein, O ye people.",
    "Verily I say unto thee, {t} shall endure when the heavens pass away.",
  ],
  "academic": [
    "The phenomenon of {t} has been examined in numerous studies.",
    "However, the mechanisms underlying {t} remain a subject of considerable debate.",
    "Furthermore, the evidence suggests that {t} is associated with several factors.",
    "Consequently, a systematic analysis of {t} requires a rigorous framework.",
  ],
}


def write_in_style(topic: str, style: str, rng: random.Random, sentences: int = 3) -> str:
  """A short templated paragraph about `topic` in `style` (`sentences` of the style's 4)."""
  if not 1 <= sentences <= len(_TEMPLATES[style]):
    raise ValueError(f"sentences: must be in [1, {len(_TEMPLATES[style])}], got {sentences}")
  chosen = rng.sample(_TEMPLATES[style], sentences)
  return " ".join(s.format(t=topic, T=topic[:1].upper() + topic[1:]) for s in chosen)


def demonstration(
  task: dict[str, Any], tool_format: str = "qwen3", style: str | None = None, sentences: int = 3
) -> list[base.Message]:
  """A paragraph of `sentences` sentences in `style` (default: one of the four, chosen by the task
  id) for SFT.

  Demonstrations cover every style, so the warm-started policy can write any of them and RL has to
  discover which one is preferred.
  """
  rng = random.Random(f"style-demo/{task['id']}")
  style = style or rng.choice(sorted(_TEMPLATES))
  text = write_in_style(task.get("topic", "this"), style, rng, sentences)
  return [*StyleEnv(judge=_NO_JUDGE).reset(task), dict(role="assistant", content=text)]


class _NoJudge:
  def judge(self, *args, **kwargs):
    raise RuntimeError("demonstration envs do not judge")


_NO_JUDGE = _NoJudge()
