"""Task data: sources (readers and generators of task records) and grain pipelines over them."""

from sao_jax.data.pipeline import make_dataset, make_iterator
from sao_jax.data.procedural import ARITH_LEVELS, ArithTasks, arith_task
from sao_jax.data.sources import (
  SOURCES,
  champ,
  gsm8k_test,
  humaneval,
  make_source,
  math_record,
  read_jsonl,
  reasoning_gym,
  style_prompts,
)

__all__ = [
  "ARITH_LEVELS",
  "SOURCES",
  "ArithTasks",
  "arith_task",
  "champ",
  "gsm8k_test",
  "humaneval",
  "make_dataset",
  "make_iterator",
  "make_source",
  "math_record",
  "read_jsonl",
  "reasoning_gym",
  "style_prompts",
]
