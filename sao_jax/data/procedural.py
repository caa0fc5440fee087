"""Procedural task families, generated deterministically from (seed, split, index).

`arith` is the CPU quickstart's task: an integer expression such as `347*29+12`, whose intended
solution is one Python tool call (`<py>print(347*29+12)</py>` -> `10075`) and the answer
`\\boxed{10075}`. Prompts are the bare expression, so a whole compact-format episode is about 100
bytes, well inside the ~256 tokens of a byte-level model. Difficulty levels (1-5) grow the number
of operands, their digits, and add parentheses; see `ARITH_LEVELS`.

Records are built on access (`ArithTasks[i]`), so a 100k-task training set costs no memory, and the
same (seed, split, index) always gives the same task on any machine (string-seeded `random.Random`
is independent of PYTHONHASHSEED). Training tasks never repeat an evaluation expression.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import random


@dataclasses.dataclass(frozen=True)
class ArithLevel:
  """Shape of the expressions of one difficulty level."""

  terms: tuple[int, int]  # operand count range (inclusive)
  digits: tuple[int, int]  # digits per operand range (inclusive)
  ops: str  # operators to draw from
  parens: bool  # wrap a random adjacent pair of terms in parentheses


ARITH_LEVELS = {
  1: ArithLevel((2, 2), (1, 2), "+-*", False),
  2: ArithLevel((3, 3), (1, 3), "+-*", False),
  3: ArithLevel((3, 4), (2, 3), "+-*", True),
  4: ArithLevel((4, 5), (2, 4), "+-*", True),
  5: ArithLevel((5, 6), (3, 5), "+-*", True),
}


def arith_expression(rng: random.Random, level: ArithLevel) -> str:
  """One random expression, e.g. '347*29+12' or '(58-7)*913+40'."""
  n = rng.randint(*level.terms)
  nums = [
    str(rng.randint(10 ** (d - 1) if d > 1 else 0, 10**d - 1))
    for d in (rng.randint(*level.digits) for _ in range(n))
  ]
  ops = [rng.choice(level.ops) for _ in range(n - 1)]
  if level.parens and n >= 3:
    i = rng.randrange(n - 1)
    nums[i], nums[i + 1] = "(" + nums[i], nums[i + 1] + ")"
  return nums[0] + "".join(op + x for op, x in zip(ops, nums[1:], strict=True))


def arith_task(seed: int, split: str, index: int, difficulty: int) -> dict:
  """The record of one arith task (see module docstring)."""
  if difficulty not in ARITH_LEVELS:
    raise ValueError(f"data.difficulty: arith has levels {sorted(ARITH_LEVELS)}, got {difficulty}")
  expr = arith_expression(
    random.Random(f"arith/{seed}/{split}/{difficulty}/{index}"), ARITH_LEVELS[difficulty]
  )
  value = eval(expr, {"__builtins__": {}})
  return dict(
    id=f"arith-L{difficulty}-{split}-{index}",
    problem=expr,
    answer=str(value),
    solution_code=f"print({expr})",
    solution_output=f"{value}\n",
    task="arith",
    difficulty=difficulty,
  )


class ArithTasks(collections.abc.Sequence):
  """A lazily generated, random-access set of arith tasks.

  Args:
    size: number of tasks.
    split: 'train' or 'eval' (independent streams).
    difficulty: level in ARITH_LEVELS.
    seed: base seed.
    exclude: expressions the set must not contain (train excludes the eval expressions); an index
      that hits one is redrawn deterministically.
  """

  def __init__(
    self,
    size: int,
    *,
    split: str,
    difficulty: int,
    seed: int = 0,
    exclude: frozenset[str] = frozenset(),
  ):
    self.size, self.split, self.difficulty, self.seed = size, split, difficulty, seed
    self.exclude = exclude
    arith_task(seed, split, 0, difficulty)  # validates the level

  def __len__(self) -> int:
    return self.size

  def __getitem__(self, index):
    if isinstance(index, slice):
      return [self[i] for i in range(*index.indices(self.size))]
    if not -self.size <= index < self.size:
      raise IndexError(index)
    index %= self.size
    task, retry = arith_task(self.seed, self.split, index, self.difficulty), 0
    while task["problem"] in self.exclude:
      retry += 1
      task = arith_task(self.seed, f"{self.split}~{retry}", index, self.difficulty)
      task["id"] = f"arith-L{self.difficulty}-{self.split}-{index}"
    return task
