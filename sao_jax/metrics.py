"""Metrics: one writer for tensorboardX events and `metrics.jsonl`, a progress bar, and timers.

Everything here owns files or clocks, so nothing here is called from jitted code. The training loop
collects a step's scalars into one dict and calls `MetricWriter.write(step, scalars)` once, so
`metrics.jsonl` has exactly one line per step and two runs can be compared line by line.
"""

from __future__ import annotations

import collections
import contextlib
import json
import math
import os
import struct
import sys
import time
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np


def _to_float(v: Any) -> float:
  return float(np.asarray(v))


class MetricWriter:
  """Writes scalars and histograms to tensorboardX event files and scalars to `metrics.jsonl`.

  Args:
    workdir: run directory; `metrics.jsonl` and `tb/` are created inside it.
    tensorboard: also write tensorboardX event files.
  """

  def __init__(self, workdir: str, *, tensorboard: bool = True):
    os.makedirs(workdir, exist_ok=True)
    self.workdir = workdir
    self._jsonl = open(os.path.join(workdir, "metrics.jsonl"), "a", buffering=1)  # noqa: SIM115
    self._tb = None
    if tensorboard:
      from tensorboardX import SummaryWriter

      self._tb = SummaryWriter(os.path.join(workdir, "tb"), flush_secs=10)

  def write(self, step: int, scalars: Mapping[str, Any]) -> dict[str, float]:
    """Appends one jsonl line `{"step": step, **scalars}` and the scalars to tensorboard.

    Args:
      step: the training step (x axis).
      scalars: name -> scalar (python number, numpy or jax scalar).

    Returns:
      The scalars as python floats (non-finite values are kept, written as NaN/Infinity).
    """
    values = {k: _to_float(v) for k, v in scalars.items()}
    self._jsonl.write(json.dumps({"step": int(step), **values}, sort_keys=True) + "\n")
    if self._tb is not None:
      for k, v in values.items():
        self._tb.add_scalar(k, v, int(step))
    return values

  def write_histograms(self, step: int, arrays: Mapping[str, Any]):
    """Writes histograms (tensorboard only) of array values, e.g. the policy-lag distribution."""
    if self._tb is None:
      return
    for k, v in arrays.items():
      v = np.asarray(v, np.float64).ravel()
      if v.size:
        self._tb.add_histogram(k, v, int(step))

  def write_text(self, tag: str, text: str, step: int = 0):
    """Writes a text summary (tensorboard only), e.g. sample trajectories."""
    if self._tb is not None:
      self._tb.add_text(tag, text, int(step))

  def flush(self):
    self._jsonl.flush()
    if self._tb is not None:
      self._tb.flush()

  def close(self):
    self.flush()
    self._jsonl.close()
    if self._tb is not None:
      self._tb.close()

  def __enter__(self) -> MetricWriter:
    return self

  def __exit__(self, *exc):
    self.close()


def read_jsonl(path: str) -> list[dict[str, float]]:
  """Reads `metrics.jsonl` back as a list of dicts (one per step)."""
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def read_tensorboard_scalars(logdir: str) -> dict[str, list[tuple[int, float]]]:
  """Reads every scalar from the tfevents files under `logdir`, without TensorFlow.

  Returns:
    tag -> [(step, value), ...] in file order.
  """
  from tensorboardX.proto import event_pb2

  out: dict[str, list[tuple[int, float]]] = collections.defaultdict(list)
  for root, _, files in os.walk(logdir):
    for name in sorted(files):
      if "tfevents" not in name:
        continue
      for record in _read_records(os.path.join(root, name)):
        event = event_pb2.Event.FromString(record)
        for v in event.summary.value:
          if v.HasField("simple_value"):
            out[v.tag].append((event.step, v.simple_value))
  return dict(out)


def _read_records(path: str) -> Iterator[bytes]:
  """TFRecord framing: u64 length, u32 crc(length), data, u32 crc(data)."""
  with open(path, "rb") as f:
    while header := f.read(12):
      (length,) = struct.unpack("<Q", header[:8])
      data = f.read(length)
      f.read(4)
      yield data


class Timers:
  """Accumulates wall time per name; `summary()` gives seconds and fractions of the total."""

  def __init__(self):
    self._totals: dict[str, float] = collections.defaultdict(float)
    self._start = time.perf_counter()

  @contextlib.contextmanager
  def measure(self, name: str):
    t0 = time.perf_counter()
    try:
      yield
    finally:
      self._totals[name] += time.perf_counter() - t0

  def add(self, name: str, seconds: float):
    self._totals[name] += seconds

  def summary(self, prefix: str = "time/") -> dict[str, float]:
    """Seconds per name since the last reset, plus `{prefix}wall`; then resets."""
    wall = time.perf_counter() - self._start
    out = {f"{prefix}{k}": v for k, v in self._totals.items()}
    out[f"{prefix}wall"] = wall
    self._totals.clear()
    self._start = time.perf_counter()
    return out


class ProgressBar:
  """A tqdm bar over steps showing step, reward and throughput; silent when not on a terminal.

  Off a terminal (CI, logs redirected to a file) it prints nothing; the loop's own log lines
  (every `log_every` steps) carry the same numbers.

  Args:
    total: number of steps.
    desc: label.
    initial: first step (when resuming).
    enabled: force on/off (default: stderr is a terminal).
  """

  def __init__(
    self, total: int, desc: str = "train", initial: int = 0, enabled: bool | None = None
  ):
    if enabled is None:
      enabled = sys.stderr.isatty()
    self._bar = None
    if enabled:
      from tqdm import tqdm

      self._bar = tqdm(total=total, initial=initial, desc=desc, dynamic_ncols=True, leave=True)

  def update(self, n: int = 1, **postfix: float):
    if self._bar is None:
      return
    shown = {
      k: (f"{v:.3g}" if isinstance(v, float) and math.isfinite(v) else v)
      for k, v in postfix.items()
    }
    self._bar.set_postfix(shown, refresh=False)
    self._bar.update(n)

  def close(self):
    if self._bar is not None:
      self._bar.close()

  def __enter__(self) -> ProgressBar:
    return self

  def __exit__(self, *exc):
    self.close()
