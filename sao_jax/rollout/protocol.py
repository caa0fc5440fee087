"""The one generate interface shared by the embedded JAX engine and the HTTP client.

An engine takes token ids and returns token ids: the agent loop never hands it text, so what the
engine generated is exactly what the trajectory records (design.md §3.1). Every output token comes
with the log-prob under the distribution it was sampled from and the weight version that sampled
it, so the learner can compute DIS ratios against the true behaviour policy even when weights
change in the middle of a sequence.

  engine.submit(GenerateRequest(input_ids=[...], max_new_tokens=64, seed=7)) -> Future
  engine.generate([req1, req2])                                              -> [res1, res2]

Sampling: `temperature == 0` is greedy (the argmax); otherwise logits are divided by the
temperature, restricted to the `top_k` largest (0 = off), then to the smallest set whose
probability reaches `top_p` (1 = off; computed after top-k, as SGLang and vLLM do), renormalized
and sampled. Ties at a cut-off are all kept.
"""

from __future__ import annotations

import abc
import concurrent.futures
import dataclasses
import uuid
from collections.abc import Sequence

FINISH_REASONS = ("stop", "length", "abort")


@dataclasses.dataclass(frozen=True)
class GenerateRequest:
  """One generation call.

  Attributes:
    input_ids: the prompt, token ids (the whole context: prompt and earlier turns).
    max_new_tokens: most tokens to generate (>= 1).
    temperature: softmax temperature; 0 = greedy.
    top_p: nucleus mass in (0, 1]; 1 = off.
    top_k: keep the k most likely tokens; 0 = off.
    stop_token_ids: generation ends after any of these (the stop token is part of the output).
    seed: sampling seed in [0, 2**63); with the weights and the fields above it fixes the output.
    rid: request id (a fresh one when empty); results carry it back.
  """

  input_ids: Sequence[int]
  max_new_tokens: int = 64
  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = 0
  stop_token_ids: Sequence[int] = ()
  seed: int = 0
  rid: str = ""

  def __post_init__(self):
    object.__setattr__(self, "input_ids", [int(t) for t in self.input_ids])
    object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
    if not self.rid:
      object.__setattr__(self, "rid", uuid.uuid4().hex)

  def check(self, *, vocab_size: int | None = None, max_len: int | None = None) -> None:
    """Raises ValueError naming the first bad field.

    Args:
      vocab_size: token ids must be below it (None: not checked).
      max_len: the prompt must be shorter than it, leaving room for one new token.
    """
    n = len(self.input_ids)
    _require(n >= 1, "input_ids", "must hold at least one token")
    _require(self.max_new_tokens >= 1, "max_new_tokens", f"must be >= 1, got {self.max_new_tokens}")
    _require(self.temperature >= 0, "temperature", f"must be >= 0, got {self.temperature}")
    _require(0 < self.top_p <= 1, "top_p", f"must be in (0, 1], got {self.top_p}")
    _require(self.top_k >= 0, "top_k", f"must be >= 0, got {self.top_k}")
    _require(0 <= self.seed < 2**63, "seed", f"must be in [0, 2**63), got {self.seed}")
    if max_len is not None:
      _require(n < max_len, "input_ids", f"{n} tokens leave no room below max_len {max_len}")
    limit = vocab_size if vocab_size is not None else float("inf")
    for field in ("input_ids", "stop_token_ids"):
      bad = [t for t in getattr(self, field) if not 0 <= t < limit]
      _require(not bad, field, f"token ids {bad[:5]} outside [0, {vocab_size or 'inf'})")


def _require(ok: bool, field: str, why: str):
  if not ok:
    raise ValueError(f"GenerateRequest.{field}: {why}")


@dataclasses.dataclass
class GenerateResult:
  """What came back for one request.

  Attributes:
    rid: the request's id.
    output_ids: generated token ids, the stop token included when there is one.
    logprobs: one float per output token: its log-prob under the distribution it was sampled from
      (temperature, top-k and top-p applied; for greedy, under softmax(logits)).
    versions: one int per output token: the weight version that produced it.
    finish_reason: 'stop' (a stop token), 'length' (max_new_tokens or the context limit), or
      'abort' (the engine was closed or told to abort; outputs so far are kept).
    prompt_len: number of input tokens.
    timings: seconds: 'queue' (submit to first prefill), 'total' (submit to finish).
  """

  rid: str
  output_ids: list[int]
  logprobs: list[float]
  versions: list[int]
  finish_reason: str
  prompt_len: int
  timings: dict[str, float] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    n = len(self.output_ids)
    if len(self.logprobs) != n or len(self.versions) != n:
      raise ValueError(
        f"GenerateResult {self.rid}: {n} output_ids, {len(self.logprobs)} logprobs and "
        f"{len(self.versions)} versions must be equally long"
      )
    if self.finish_reason not in FINISH_REASONS:
      raise ValueError(
        f"GenerateResult.finish_reason: {self.finish_reason!r} not in {FINISH_REASONS}"
      )


class GenerateEngine(abc.ABC):
  """Anything that turns GenerateRequests into GenerateResults: the embedded engine, HTTP client."""

  @abc.abstractmethod
  def submit(self, request: GenerateRequest) -> concurrent.futures.Future:
    """Queues one request; the Future resolves to its GenerateResult (or raises its error)."""

  def generate(self, requests: Sequence[GenerateRequest]) -> list[GenerateResult]:
    """Submits every request at once and waits for all; results are in request order."""
    futures = [self.submit(r) for r in requests]
    return [f.result() for f in futures]

  @property
  def version(self) -> int:
    """The weight version new tokens are sampled with (-1 when unknown)."""
    return -1

  @abc.abstractmethod
  def close(self) -> None:
    """Releases threads and connections; in-flight requests finish with 'abort'."""
