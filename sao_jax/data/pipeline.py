"""grain pipelines over task records: deterministic shuffle, per-host sharding, repetition, resume.

    it = data.make_iterator(records, seed=0, process_index=jax.process_index(),
                            process_count=jax.process_count())
    task = next(it); state = it.get_state(); ...; it.set_state(state)   # continues exactly

Everything runs in the calling thread (no worker processes), so there are no absl-flag or spawn
requirements and start-up is instant. Each host reads a disjoint, equal-sized shard (records
`process_index::process_count`, trimmed to the shortest shard), and the order is reshuffled every
epoch with a seed derived from (seed, epoch).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grain


def make_dataset(
  records: Sequence[dict[str, Any]],
  *,
  seed: int = 0,
  shuffle: bool = True,
  num_epochs: int | None = None,
  process_index: int = 0,
  process_count: int = 1,
) -> grain.MapDataset:
  """The random-access grain dataset of this host's tasks.

  Args:
    records: a random-access sequence of task records (sao_jax.data.make_source).
    seed: shuffle seed (the same on every host, so shards stay disjoint).
    shuffle: reshuffle every epoch.
    num_epochs: passes over the data; None repeats forever.
    process_index: this host's index.
    process_count: number of hosts.

  Returns:
    A grain.MapDataset of records.
  """
  if not 0 <= process_index < process_count:
    raise ValueError(f"process_index: must be in [0, {process_count}), got {process_index}")
  per_host = len(records) // process_count
  if per_host == 0:
    raise ValueError(f"records: {len(records)} records cannot feed {process_count} hosts")
  ds = grain.MapDataset.source(records)
  ds = ds[process_index::process_count][:per_host]
  if shuffle:
    ds = ds.shuffle(seed=seed)
  return ds.repeat(num_epochs)


def make_iterator(records: Sequence[dict[str, Any]], **kwargs) -> grain.DatasetIterator:
  """An iterator over `make_dataset(records, **kwargs)` with get_state()/set_state()."""
  return iter(make_dataset(records, **kwargs).to_iter_dataset())
