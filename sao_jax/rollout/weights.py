"""Weight publishing: after each learner step, rollout engines sample with the new policy version.

  publisher = InProcessPublisher(engine)                      # the embedded engine: a device copy
  publisher = HttpPublisher("/shared/weights", http_engine,   # SGLang / sao_jax.serve hosts
                            graphdef=learner.policy_def, keep=2)
  publisher = make_publisher(config, engine, graphdef=learner.policy_def,
                             directory=os.path.join(workdir, "weights"))   # either, from the config
  seconds = publisher.publish(state.policy, version)
  publisher.stats()   # {"count", "last_s", "mean_s", "max_s", "version", ...}

`HttpPublisher` writes HF-layout safetensors (`models.export_hf`) to `<dir>/v<version>.tmp`,
renames it to `<dir>/v<version>` (atomic on one filesystem, so an engine never reads a half-written
version), POSTs `/update_weights_from_disk {model_path, weight_version}` to every engine URL, and
then deletes all but the newest `keep` version directories (and leftovers of interrupted writes).
The directory must be one the engines can read at the same path (shared storage), or pass
`engine_dir`, the same directory as the engines mount it.

Order matters in async mode: raise the replay queue's version to v before publishing v, or the
first trajectories sampled with v are rejected as "version_from_future" (`workers.publish_weights`
does both in that order).
"""

from __future__ import annotations

import abc
import collections
import os
import re
import shutil
import time
from collections.abc import Sequence
from typing import Any

_VERSION_DIR = re.compile(r"^v(\d+)$")
_LEFTOVER_DIR = re.compile(r"^v\d+\.(tmp|old)$")


class WeightPublisher(abc.ABC):
  """Makes rollout engines sample with new weights; measures how long each publish takes."""

  def __init__(self):
    self.count = 0
    self.version = -1
    self.last: dict[str, float] = {}
    self._latencies: collections.deque[float] = collections.deque(maxlen=1024)

  def publish(self, params: Any, version: int) -> float:
    """Publishes `params` as weight version `version`; blocks until engines use them.

    Args:
      params: the policy's parameters (`nnx.State` of nnx.Param, as in `TrainState.policy`) or a
        `models.Policy`.
      version: the policy version new tokens will be tagged with.

    Returns:
      Seconds the publish took.
    """
    t0 = time.perf_counter()
    parts = self._publish(params, int(version)) or {}
    seconds = time.perf_counter() - t0
    self._latencies.append(seconds)
    self.count += 1
    self.version = int(version)
    self.last = {"total_s": seconds, **parts}
    return seconds

  @abc.abstractmethod
  def _publish(self, params: Any, version: int) -> dict[str, float] | None:
    """Does the work; may return a breakdown of the time ({"write_s": ..., "load_s": ...})."""

  def stats(self) -> dict[str, float]:
    """{"count", "version", "last_s", "mean_s", "max_s"} (over the last 1024 publishes), plus the
    last publish's breakdown as "last_<part>"."""
    lat = list(self._latencies)
    out = {
      "count": float(self.count),
      "version": float(self.version),
      "last_s": lat[-1] if lat else 0.0,
      "mean_s": sum(lat) / len(lat) if lat else 0.0,
      "max_s": max(lat) if lat else 0.0,
    }
    out.update({f"last_{k}": v for k, v in self.last.items() if k != "total_s"})
    return out

  def close(self) -> None:  # noqa: B027 (optional hook; most publishers hold nothing)
    """Releases what the publisher holds (nothing by default)."""


class InProcessPublisher(WeightPublisher):
  """Swaps weights into an embedded `Engine` (a device copy; in-flight sequences continue).

  Args:
    engine: anything with `update_weights(params, version)` (sao_jax.rollout.Engine).
  """

  def __init__(self, engine: Any):
    super().__init__()
    self.engine = engine

  def _publish(self, params: Any, version: int) -> None:
    self.engine.update_weights(params, version)
    pending = getattr(self.engine, "params", None)
    if pending is not None:  # count the device copy in the latency, not just its dispatch
      import jax

      jax.block_until_ready(pending)


class HttpPublisher(WeightPublisher):
  """Publishes through disk: versioned safetensors directories + `/update_weights_from_disk`.

  Args:
    directory: where version directories are written (created).
    engine: an `HttpEngine` (its `update_weights_from_disk` reaches every server), or engine base
      URLs (a list or a comma-separated string).
    graphdef: the policy's nnx GraphDef (`nnx.split(policy, nnx.Param)[0]`), needed when
      `publish` is given an `nnx.State`.
    keep: newest version directories kept on disk (>= 1).
    dtype: on-disk dtype ('float32' / 'bfloat16'; default: the parameter dtype).
    engine_dir: `directory` as the engines see it (default: the same path).
    timeout_s: HTTP timeout of one update call.
  """

  def __init__(
    self,
    directory: str,
    engine: Any,
    *,
    graphdef: Any = None,
    keep: int = 2,
    dtype: str | None = None,
    engine_dir: str | None = None,
    timeout_s: float = 600.0,
  ):
    super().__init__()
    if keep < 1:
      raise ValueError(f"HttpPublisher.keep: must be >= 1, got {keep}")
    self._owns_engine = isinstance(engine, str | Sequence)
    if self._owns_engine:
      from sao_jax.rollout.http_client import HttpEngine

      engine = HttpEngine(engine, timeout_s=timeout_s)
    self.directory, self.engine, self.graphdef = directory, engine, graphdef
    self.keep, self.dtype, self.engine_dir = keep, dtype, engine_dir or directory
    os.makedirs(directory, exist_ok=True)

  def path(self, version: int) -> str:
    """The directory of `version` on this host."""
    return os.path.join(self.directory, f"v{int(version)}")

  def write(self, params: Any, version: int) -> str:
    """Writes `params` to `<dir>/v<version>` atomically (via `.tmp`); returns that path.

    A directory of the same version is replaced (e.g. republished after a resume).
    """
    from sao_jax import models

    final, tmp = self.path(version), self.path(version) + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
      models.export_hf(self._policy(params), tmp, dtype=self.dtype)
    except BaseException:
      shutil.rmtree(tmp, ignore_errors=True)
      raise
    old = final + ".old"
    if os.path.exists(final):
      shutil.rmtree(old, ignore_errors=True)
      os.rename(final, old)
    os.rename(tmp, final)
    shutil.rmtree(old, ignore_errors=True)
    return final

  def cleanup(self) -> list[int]:
    """Deletes all but the newest `keep` version directories and any interrupted writes.

    Returns:
      The versions deleted.
    """
    versions = sorted(
      int(m.group(1)) for m in map(_VERSION_DIR.match, os.listdir(self.directory)) if m
    )
    gone = versions[: max(0, len(versions) - self.keep)]
    for v in gone:
      shutil.rmtree(self.path(v), ignore_errors=True)
    for name in os.listdir(self.directory):
      if _LEFTOVER_DIR.match(name):
        shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)
    return gone

  def _publish(self, params: Any, version: int) -> dict[str, float]:
    t0 = time.perf_counter()
    self.write(params, version)
    t1 = time.perf_counter()
    remote = os.path.join(self.engine_dir, f"v{version}")
    self.engine.update_weights_from_disk(remote, version)
    t2 = time.perf_counter()
    self.cleanup()
    return {"write_s": t1 - t0, "load_s": t2 - t1}

  def _policy(self, params: Any) -> Any:
    from flax import nnx

    if isinstance(params, nnx.Module):
      return params
    if self.graphdef is None:
      raise ValueError("HttpPublisher: publishing an nnx.State needs `graphdef` (the policy's)")
    return nnx.merge(self.graphdef, params)

  def close(self) -> None:
    """Closes the HttpEngine if this publisher made it from URLs."""
    if self._owns_engine:
      self.engine.close()


def make_publisher(
  config: Any, engine: Any, *, graphdef: Any = None, directory: str = ""
) -> WeightPublisher:
  """The run's publisher: in-process for the embedded engine, through disk for HTTP engines.

  Args:
    config: a run config (`rollout.engine`; optional `rollout.weights_keep` (default 2) and
      `rollout.weights_engine_dir` (default: `directory`) when the config has them).
    engine: the embedded Engine, or the HttpEngine the rollout workers use.
    graphdef: the policy's nnx GraphDef (HTTP only).
    directory: where version directories go (HTTP only), e.g. `<workdir>/weights` on storage the
      engines can read.

  Returns:
    An InProcessPublisher or an HttpPublisher.
  """
  r = config.rollout
  if r.engine == "embedded":
    return InProcessPublisher(engine)
  if not directory:
    raise ValueError("make_publisher: HTTP engines need a weights directory")
  keep = int(r.get("weights_keep", 2))
  engine_dir = r.get("weights_engine_dir", "") or None
  return HttpPublisher(directory, engine, graphdef=graphdef, keep=keep, engine_dir=engine_dir)
