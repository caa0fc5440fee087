"""The embedded JAX rollout engine: continuous batching over a slotted KV cache.

Shapes: S = slots (sequences decoded together), M = cache length per slot (`max_len`), P = prompts
per prefill call (`prefill_batch`), Tb = a prompt bucket length, V = vocabulary.

A background thread owns the model state and the cache and loops:

  1. apply a pending `update_weights` (so weights change only between decode steps);
  2. admit queued requests into free slots: prefill each prompt (padded to its bucket) into its slot
     and sample its first token;
  3. one decode step for all S slots at once (inactive rows are computed and ignored), sampling one
     token per active slot; attention reads the smallest compiled window of cache positions
     (`decode_windows`) that holds the longest active sequence, so short sequences in a long
     cache do not pay for M;
  4. finish sequences that hit a stop token, `max_new_tokens` or the cache length: resolve their
     futures and free their slots at once, so a queued request starts on the next iteration while
     the others keep decoding.

Compiled functions have static shapes: one decode step `[S]` per window, and one prefill per
bucket `[P, Tb]`; nothing recompiles per request or after a weight swap (`num_compilations` counts
XLA compilations of the step functions, through jax.monitoring).

Determinism: token i of a request is drawn with the uniform `sampling.row_uniforms(engine seed,
request seed, i)`, every row of a step is computed independently, and a prompt's prefill shape
depends only on its own length. The decode window depends on the neighbours, but positions past a
row's length carry exactly zero attention weight, and the outputs are bit-identical across windows
(tested on CPU; a backend whose reductions regroup by length could differ in the last bit). So a
request's output depends only on (weights, input_ids, sampling parameters, seed): not on its slot,
its neighbours or thread timing (tested). There is deliberately no prefix cache: reusing KV computed
by decode steps (or by older weights) would change the numbers from run to run.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import threading
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from sao_jax import models
from sao_jax.rollout import sampling
from sao_jax.rollout.protocol import GenerateEngine, GenerateRequest, GenerateResult


@dataclasses.dataclass
class _Seq:
  """A request in flight: its future and what it has generated so far."""

  request: GenerateRequest
  future: concurrent.futures.Future
  submitted: float
  started: float = 0.0
  output_ids: list[int] = dataclasses.field(default_factory=list)
  logprobs: list[float] = dataclasses.field(default_factory=list)
  versions: list[int] = dataclasses.field(default_factory=list)


def default_buckets(max_len: int, smallest: int = 32) -> tuple[int, ...]:
  """Prompt bucket lengths: 32, 48, 64, 96, 128, 192, ... (at most a third is padding), then max_len.

  Args:
    max_len: the engine's cache length; the last bucket.
    smallest: the first bucket.

  Returns:
    Increasing lengths, each compiled once (lazily, or by `Engine.warmup`).
  """
  out, b = [], smallest
  while b < max_len:
    out += [b, b * 3 // 2]
    b *= 2
  return (*(x for x in out if x < max_len), max_len)


def default_windows(max_len: int, smallest: int = 64) -> tuple[int, ...]:
  """Decode attention windows: 64, 128, 256, ... (doubling), then max_len.

  Args:
    max_len: the engine's cache length; the last window.
    smallest: the first window.

  Returns:
    Increasing lengths; each is one compiled decode step.
  """
  out, w = [], smallest
  while w < max_len:
    out.append(w)
    w *= 2
  return (*out, max_len)


class Engine(GenerateEngine):
  """Continuous-batching generation on a `models.Policy`, in a background thread.

  Args:
    model: a `models.Policy`, or `(graphdef, state)` from `nnx.split(policy)`.
    num_slots: S, sequences decoded together.
    max_len: M, most tokens (prompt + output) a sequence may hold.
    prompt_buckets: prompt lengths compiled for prefill (default `default_buckets(max_len)`).
    decode_windows: cache lengths a decode step may attend to, each compiled once; max_len is
      always added (default `default_windows(max_len)`; `(max_len,)` compiles one decode step that
      always reads all M).
    prefill_batch: P, prompts of one bucket prefilled per call (padded with empty rows).
    seed: engine seed, folded into every request's sampling key.
    version: weight version of `model`.
    cache_dtype: KV cache dtype (default: the model's compute dtype).
  """

  def __init__(
    self,
    model: Any,
    *,
    num_slots: int = 16,
    max_len: int = 1024,
    prompt_buckets: Sequence[int] | None = None,
    decode_windows: Sequence[int] | None = None,
    prefill_batch: int = 1,
    seed: int = 0,
    version: int = 0,
    cache_dtype: Any = None,
  ):
    graphdef, state = model if isinstance(model, tuple) else nnx.split(model)
    state = _owned_copy(state)  # the caller may donate or update its own arrays later
    self.cfg: models.ModelConfig = nnx.merge(graphdef, state).cfg
    buckets = tuple(sorted(set(prompt_buckets or default_buckets(max_len))))
    if num_slots < 1 or prefill_batch < 1:
      raise ValueError(
        f"Engine: num_slots {num_slots} and prefill_batch {prefill_batch} must be >= 1"
      )
    if buckets[0] < 1 or buckets[-1] > max_len:
      raise ValueError(f"Engine.prompt_buckets: {buckets} must lie in [1, max_len={max_len}]")
    windows = tuple(sorted({*(decode_windows or default_windows(max_len)), max_len}))
    if windows[0] < 1 or windows[-1] > max_len:
      raise ValueError(f"Engine.decode_windows: {windows} must lie in [1, max_len={max_len}]")
    self.num_slots, self.max_len, self.buckets = num_slots, max_len, buckets
    self.windows = windows
    self.prefill_batch = prefill_batch
    self._graphdef, self._state, self._version = graphdef, state, int(version)
    self.seed = int(seed)
    # The cache and the sampled tokens stay on one fixed placement (replicated over the weights'
    # mesh, if any), so every step sees the same input shardings and nothing recompiles.
    place = _placement(state)
    self._cache = jax.device_put(
      models.init_cache(self.cfg, num_slots, max_len, cache_dtype), place
    )
    self._decode_fn = jax.jit(
      self._decode_impl, static_argnames="window", donate_argnums=1, out_shardings=place
    )
    self._prefill_fn = jax.jit(self._prefill_impl, donate_argnums=1, out_shardings=place)
    self._compiles = collections.Counter()
    self._cv = threading.Condition()
    self._pending: collections.deque[_Seq] = collections.deque()
    self._slots: list[_Seq | None] = [None] * num_slots
    self._new_weights: tuple[Any, int] | None = None
    self._paused = self._closed = False
    self._error: BaseException | None = None
    self._stats = collections.Counter()
    self._thread = threading.Thread(target=self._loop, name="sao-engine", daemon=True)
    self._thread.start()

  # ------------------------------------------------------------------------------ public API
  def submit(self, request: GenerateRequest) -> concurrent.futures.Future:
    """Queues a request; the future resolves to its GenerateResult (see protocol.py)."""
    request.check(vocab_size=self.cfg.vocab_size, max_len=self.max_len)
    seq = _Seq(request, concurrent.futures.Future(), time.perf_counter())
    with self._cv:
      if self._error is not None:
        raise RuntimeError("Engine: the engine thread failed") from self._error
      if self._closed:
        raise RuntimeError("Engine: submit after close()")
      self._pending.append(seq)
      self._cv.notify_all()
    return seq.future

  def update_weights(self, params: Any, version: int) -> None:
    """Swaps in new weights before the next decode step; later tokens carry `version`.

    Sequences in flight continue (their cached keys/values stay); every request submitted after
    this call returns is sampled entirely with these weights or newer ones. The weights are copied
    onto the engine's devices, so the caller may keep updating (or donating) its own arrays.

    Args:
      params: a `models.Policy` or its `nnx.State` (the structure of `nnx.split(policy)[1]`).
      version: the weight version to record on tokens from now on.
    """
    state = nnx.state(params) if isinstance(params, nnx.Module) else params
    if jax.tree.structure(state) != jax.tree.structure(self._state):
      raise ValueError("Engine.update_weights: params do not have the engine model's structure")
    for new, old in zip(jax.tree.leaves(state), jax.tree.leaves(self._state), strict=True):
      if new.shape != old.shape or new.dtype != old.dtype:
        raise ValueError(
          f"Engine.update_weights: a parameter is {new.dtype}{list(new.shape)}, the engine's "
          f"is {old.dtype}{list(old.shape)}"
        )
    copy = _owned_copy(state, like=self._state)
    with self._cv:
      self._new_weights = (copy, int(version))
      self._cv.notify_all()

  @property
  def version(self) -> int:
    """The weight version the next token will be sampled with (after any pending swap)."""
    with self._cv:
      return self._new_weights[1] if self._new_weights else self._version

  @property
  def params(self) -> Any:
    """The engine's current model state (`nnx.State`)."""
    with self._cv:
      return self._new_weights[0] if self._new_weights else self._state

  def pause(self) -> None:
    """Stops decoding after the current step; in-flight sequences keep their slots and cache."""
    with self._cv:
      self._paused = True

  def resume(self) -> None:
    """Continues after `pause`."""
    with self._cv:
      self._paused = False
      self._cv.notify_all()

  def abort(self, rids: Sequence[str] | None = None) -> int:
    """Finishes queued and in-flight requests now with 'abort' (all, or those in `rids`).

    Returns:
      How many were aborted.
    """
    hit = (lambda seq: True) if rids is None else (lambda seq: seq.request.rid in set(rids))
    with self._cv:
      seqs = [s for s in self._pending if hit(s)]
      self._pending = collections.deque(s for s in self._pending if not hit(s))
      for i, seq in enumerate(self._slots):
        if seq is not None and hit(seq):
          seqs.append(seq)
          self._slots[i] = None
    for seq in seqs:
      self._resolve(seq, "abort")
    return len(seqs)

  def close(self) -> None:
    """Stops the thread; queued and in-flight requests finish with 'abort'."""
    with self._cv:
      self._closed = True
      self._cv.notify_all()
    self._thread.join()
    self.abort()

  def __enter__(self) -> Engine:
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  @property
  def num_compilations(self) -> int:
    """XLA compilations of the step functions so far (one per prefill bucket and decode window).

    Counted from jax.monitoring's backend-compile events in the engine's own calls, so a load from
    the persistent compilation cache counts too: this is the number of in-memory cache misses.
    """
    return sum(self._compiles.values())

  def stats(self) -> dict[str, float]:
    """Counters: decode steps, tokens, prefills, compilations, and slot utilization: the mean
    fraction of slots decoding per step, over all steps and over the steps when requests waited
    (`slot_utilization_backlogged`: below 1 only if a freed slot was not refilled at once)."""
    with self._cv:
      st = dict(self._stats)
      st["queued"], st["active"] = len(self._pending), sum(s is not None for s in self._slots)
      st["failed"] = int(self._error is not None)
    steps, backlog = st.get("decode_steps", 0), st.get("backlog_steps", 0)
    st["slot_utilization"] = st.get("active_slot_steps", 0) / max(steps * self.num_slots, 1)
    busy = st.get("backlog_active_slot_steps", 0)
    st["slot_utilization_backlogged"] = busy / max(backlog * self.num_slots, 1)
    st["compilations"] = self.num_compilations
    return st

  def reset_stats(self) -> None:
    """Zeroes the counters of `stats` (not the compilation count)."""
    with self._cv:
      self._stats.clear()

  def warmup(self, buckets: Sequence[int] | None = None) -> None:
    """Compiles every decode window and the prefill of `buckets` (default all) now, with no slot
    touched."""
    with self._cv:
      if any(s is not None for s in self._slots) or self._pending:
        raise RuntimeError("Engine.warmup: call it before submitting requests")
      for w in self.windows:
        with _counting(self._compiles, f"decode_{w}"):
          inputs = self._step_arrays([])
          self._cache, *_ = self._decode_fn(self._state, self._cache, *inputs, window=w)
      for tb in buckets or self.buckets:
        with _counting(self._compiles, f"prefill_{tb}"):
          inputs = self._prefill_arrays([], tb)
          self._cache, *_ = self._prefill_fn(self._state, self._cache, *inputs)
      jax.block_until_ready(self._cache)

  # --------------------------------------------------------------------------- compiled steps
  def _decode_impl(
    self, state, cache, tokens_s, active_s, seeds_s2, steps_s, temp_s, top_p_s, top_k_s, *, window
  ):
    """Appends each active slot's last token and samples the next: (cache, tokens_s, logprobs_s)."""
    cache, logits_sv = models.decode_step(
      (self._graphdef, state), cache, tokens_s, active_s, window=window
    )
    uniforms_s = sampling.row_uniforms(self.seed, seeds_s2, steps_s)
    tokens_s, logprobs_s = sampling.sample(logits_sv, uniforms_s, temp_s, top_p_s, top_k_s)
    return cache, tokens_s, logprobs_s

  def _prefill_impl(
    self, state, cache, tokens_pt, lengths_p, slots_p, seeds_p2, temp_p, top_p_p, top_k_p
  ):
    """Writes P prompts into their slots and samples each one's first token."""
    cache, logits_pv = models.prefill((self._graphdef, state), cache, tokens_pt, lengths_p, slots_p)
    steps_p = jnp.zeros(lengths_p.shape, jnp.int32)
    uniforms_p = sampling.row_uniforms(self.seed, seeds_p2, steps_p)
    tokens_p, logprobs_p = sampling.sample(logits_pv, uniforms_p, temp_p, top_p_p, top_k_p)
    return cache, tokens_p, logprobs_p

  @staticmethod
  def _sampling_arrays(seqs: Sequence[_Seq | None], n: int):
    """Per-row seeds [n, 2], temperature, top_p, top_k for rows `seqs` (None or missing: greedy)."""
    seeds = np.zeros((n, 2), np.uint32)
    temp, top_p, top_k = np.zeros(n, np.float32), np.ones(n, np.float32), np.zeros(n, np.int32)
    for i, seq in enumerate(seqs):
      if seq is not None:
        r = seq.request
        seeds[i] = sampling.split_seed(r.seed)
        temp[i], top_p[i], top_k[i] = r.temperature, r.top_p, r.top_k
    return seeds, temp, top_p, top_k

  def _step_arrays(self, slots: Sequence[_Seq | None]):
    """Host inputs of a decode step over `slots` (length S, or [] for a dry run)."""
    s = self.num_slots
    tokens, active, steps = np.zeros(s, np.int32), np.zeros(s, bool), np.zeros(s, np.int32)
    for i, seq in enumerate(slots):
      if seq is not None:
        tokens[i], active[i], steps[i] = seq.output_ids[-1], True, len(seq.output_ids)
    seeds, temp, top_p, top_k = self._sampling_arrays(slots, s)
    return tokens, active, seeds, steps, temp, top_p, top_k

  def _prefill_arrays(self, group: Sequence[tuple[int, _Seq]], bucket: int):
    """Host inputs of one prefill call: `group` is (slot, seq) pairs; empty rows target slot S."""
    p = self.prefill_batch
    tokens, lengths = np.zeros((p, bucket), np.int32), np.ones(p, np.int32)
    slots = np.full(p, self.num_slots, np.int32)  # out of range: the row writes nothing
    for i, (slot, seq) in enumerate(group):
      ids = seq.request.input_ids
      tokens[i, : len(ids)], lengths[i], slots[i] = ids, len(ids), slot
    seeds, temp, top_p, top_k = self._sampling_arrays([seq for _, seq in group], p)
    return tokens, lengths, slots, seeds, temp, top_p, top_k

  # ------------------------------------------------------------------------------ the loop
  def _loop(self) -> None:
    try:
      while True:
        with self._cv:
          while not self._closed and (self._paused or not (self._pending or self._any_active())):
            self._cv.wait()
          if self._closed:
            return
          if self._new_weights is not None:
            (self._state, self._version), self._new_weights = self._new_weights, None
            self._stats["weight_updates"] += 1
          admitted = self._admit()
        for bucket, group in admitted:
          self._run_prefill(bucket, group)
        if self._any_active():
          self._run_decode()
    except BaseException as e:  # fail every waiter rather than hang them
      with self._cv:
        self._error = e
      self.abort_with(e)

  def _any_active(self) -> bool:
    return any(s is not None for s in self._slots)

  def _bucket(self, n: int) -> int:
    return next(b for b in self.buckets if b >= n)

  def _admit(self) -> list[tuple[int, list[tuple[int, _Seq]]]]:
    """Moves queued requests into free slots (FIFO), grouped into prefill calls of one bucket."""
    free = [i for i, s in enumerate(self._slots) if s is None]
    groups: dict[int, list[list[tuple[int, _Seq]]]] = {}
    order = []
    while free and self._pending:
      seq, slot = self._pending.popleft(), free.pop(0)
      seq.started = time.perf_counter()
      self._slots[slot] = seq
      bucket = self._bucket(len(seq.request.input_ids))
      calls = groups.setdefault(bucket, [])
      if not calls or len(calls[-1]) == self.prefill_batch:
        calls.append([])
        order.append((bucket, calls[-1]))
      calls[-1].append((slot, seq))
    return order

  def _run_prefill(self, bucket: int, group: list[tuple[int, _Seq]]) -> None:
    inputs = self._prefill_arrays(group, bucket)
    with _counting(self._compiles, f"prefill_{bucket}"):
      self._cache, tokens_p, logprobs_p = self._prefill_fn(self._state, self._cache, *inputs)
    tokens_p, logprobs_p = jax.device_get((tokens_p, logprobs_p))
    self._stats["prefills"] += len(group)
    self._stats["prefill_calls"] += 1
    self._stats["prefill_tokens"] += sum(len(seq.request.input_ids) for _, seq in group)
    for i, (slot, seq) in enumerate(group):
      self._append(slot, seq, int(tokens_p[i]), float(logprobs_p[i]))

  def _window(self, slots: Sequence[_Seq | None]) -> int:
    """The smallest decode window that holds every active sequence after this step's token."""
    need = max(len(s.request.input_ids) + len(s.output_ids) for s in slots if s is not None)
    return next(w for w in self.windows if w >= need)

  def _run_decode(self) -> None:
    slots = list(self._slots)
    inputs = self._step_arrays(slots)
    window = self._window(slots)
    with _counting(self._compiles, f"decode_{window}"):
      self._cache, tokens_s, logprobs_s = self._decode_fn(
        self._state, self._cache, *inputs, window=window
      )
    tokens_s, logprobs_s = jax.device_get((tokens_s, logprobs_s))
    active = [i for i, seq in enumerate(slots) if seq is not None]
    self._stats["decode_steps"] += 1
    self._stats["active_slot_steps"] += len(active)
    if self._pending:  # requests were waiting: every free slot here is a scheduling loss
      self._stats["backlog_steps"] += 1
      self._stats["backlog_active_slot_steps"] += len(active)
    for i in active:
      self._append(i, slots[i], int(tokens_s[i]), float(logprobs_s[i]))

  def _append(self, slot: int, seq: _Seq, token: int, logprob: float) -> None:
    """Records one sampled token; finishes the sequence and frees its slot when it is done."""
    seq.output_ids.append(token)
    seq.logprobs.append(logprob)
    seq.versions.append(self._version)
    self._stats["tokens"] += 1
    r, n = seq.request, len(seq.output_ids)
    if token in r.stop_token_ids:
      reason = "stop"
    elif n >= r.max_new_tokens or len(r.input_ids) + n >= self.max_len:
      reason = "length"
    else:
      return
    with self._cv:
      if self._slots[slot] is seq:  # not already aborted
        self._slots[slot] = None
        self._cv.notify_all()
      else:
        return
    self._resolve(seq, reason)

  def _resolve(self, seq: _Seq, reason: str) -> None:
    now = time.perf_counter()
    started = seq.started or now
    result = GenerateResult(
      rid=seq.request.rid,
      output_ids=list(seq.output_ids),
      logprobs=list(seq.logprobs),
      versions=list(seq.versions),
      finish_reason=reason,
      prompt_len=len(seq.request.input_ids),
      timings={"queue": started - seq.submitted, "total": now - seq.submitted},
    )
    if not seq.future.done():
      seq.future.set_result(result)

  def abort_with(self, error: BaseException) -> None:
    """Fails every queued and in-flight request with `error` (used when the loop dies)."""
    with self._cv:
      seqs = list(self._pending) + [s for s in self._slots if s is not None]
      self._pending.clear()
      self._slots = [None] * self.num_slots
    for seq in seqs:
      if not seq.future.done():
        seq.future.set_exception(error)


def _owned_copy(tree: Any, like: Any = None) -> Any:
  """Fresh, committed device copies of `tree`'s arrays (placed like `like`'s leaves if given).

  Committed arrays keep the compiled functions' input placement identical across weight swaps
  (an uncommitted and a committed argument compile separately).
  """
  like = tree if like is None else like
  return jax.tree.map(lambda x, ref: jax.device_put(x, ref.sharding, may_alias=False), tree, like)


def _placement(state: Any) -> jax.sharding.Sharding:
  """Replicated over the mesh of the first weight with a NamedSharding, else its device."""
  first = jax.tree.leaves(state)[0]
  if isinstance(first.sharding, jax.sharding.NamedSharding):
    return jax.sharding.NamedSharding(first.sharding.mesh, jax.sharding.PartitionSpec())
  return jax.sharding.SingleDeviceSharding(next(iter(first.devices())))


_COUNTER = threading.local()


def _on_compile(event: str, duration: float, **kwargs) -> None:
  del duration, kwargs
  counter = getattr(_COUNTER, "value", None)
  if event == "/jax/core/compile/backend_compile_duration" and counter is not None:
    counter[_COUNTER.key] += 1


jax.monitoring.register_event_duration_secs_listener(_on_compile)


@contextlib.contextmanager
def _counting(counter: collections.Counter, key: str):
  """Counts the XLA compilations this thread runs inside the block into `counter[key]`."""
  _COUNTER.value, _COUNTER.key = counter, key
  try:
    yield
  finally:
    _COUNTER.value = None
