"""The generate interface over HTTP: SGLang servers (GPU hosts) and `sao_jax.serve` alike.

  engine = HttpEngine("http://gpu0:30000,http://gpu1:30000", timeout_s=600, max_retries=3)
  engine.generate([GenerateRequest(input_ids=[...], seed=7)])
  engine.update_weights_from_disk("/shared/weights/v12", version=12)   # every server

Requests go to the server with the fewest requests in flight (ties in turn). A connection error,
a timeout or an HTTP 5xx is retried with exponential backoff, on another server when there is one;
a server that failed is avoided for `cooldown_s`. An HTTP 4xx is the caller's fault and raises
ValueError at once. Each request resolves its future exactly once: a retry replaces the lost
attempt (which is told to abort, best effort) rather than adding a second result, so an episode is
never counted twice. The retry carries the same seed, so on the same weights it samples the same
tokens.

Token versions come from the response's `weight_versions` spans or `weight_version` when they are
integers (sao_jax.serve sends both); an SGLang server started without a numeric version reports
e.g. 'default', and then the version this client last published (`update_weights_from_disk`) is
recorded, which can only understate a token's version.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import http.client
import itertools
import json
import threading
import time
import urllib.parse
from collections.abc import Sequence
from typing import Any

from sao_jax.rollout.protocol import GenerateEngine, GenerateRequest, GenerateResult


class ServerError(RuntimeError):
  """A server could not be reached or failed (HTTP 5xx); retried by HttpEngine."""


class _Server:
  """One base URL with its in-flight count and the time of its last failure."""

  def __init__(self, url: str):
    parsed = urllib.parse.urlsplit(url if "//" in url else f"http://{url}")
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
      raise ValueError(f"HttpEngine.urls: {url!r} is not an http(s)://host:port URL")
    self.url, self.scheme = url, parsed.scheme
    self.host, self.port = parsed.hostname, parsed.port or (443 if parsed.scheme == "https" else 80)
    self.inflight = 0
    self.failed_at = -float("inf")


def request_json(server: _Server, method: str, path: str, payload: Any, timeout_s: float) -> Any:
  """One HTTP call; returns the decoded JSON body.

  Raises:
    ServerError: connection failure, timeout, or HTTP >= 500 (retryable).
    ValueError: HTTP 4xx, with the server's message.
  """
  cls = http.client.HTTPSConnection if server.scheme == "https" else http.client.HTTPConnection
  conn = cls(server.host, server.port, timeout=timeout_s)
  data = None if payload is None else json.dumps(payload).encode()
  headers = {"Content-Type": "application/json"} if data is not None else {}
  try:
    conn.request(method, path, body=data, headers=headers)
    resp = conn.getresponse()
    raw = resp.read()
  except (OSError, http.client.HTTPException) as e:  # refused, reset, timeout, bad status line
    raise ServerError(f"{server.url}{path}: {type(e).__name__}: {e}") from e
  finally:
    conn.close()
  try:
    body = json.loads(raw) if raw else None
  except json.JSONDecodeError:
    body = raw.decode(errors="replace")
  if resp.status >= 500:
    raise ServerError(f"{server.url}{path}: HTTP {resp.status}: {_message(body)}")
  if resp.status >= 400:
    raise ValueError(f"{server.url}{path}: HTTP {resp.status}: {_message(body)}")
  return body


def _message(body: Any) -> str:
  if isinstance(body, dict) and isinstance(body.get("error"), dict):
    return str(body["error"].get("message", body))
  return str(body)[:500]


def to_sglang(request: GenerateRequest, rid: str) -> dict[str, Any]:
  """The SGLang /generate body of a request."""
  return {
    "input_ids": list(request.input_ids),
    "sampling_params": {
      "max_new_tokens": request.max_new_tokens,
      "temperature": request.temperature,
      "top_p": request.top_p,
      "top_k": request.top_k if request.top_k > 0 else -1,
      "stop_token_ids": list(request.stop_token_ids),
      "sampling_seed": request.seed,
      "skip_special_tokens": False,
      "no_stop_trim": True,
    },
    "return_logprob": True,
    "rid": rid,
  }


def from_sglang(body: Any, request: GenerateRequest, default_version: int) -> GenerateResult:
  """A GenerateResult from an SGLang /generate response (raises ServerError when malformed)."""
  try:
    meta = body["meta_info"]
    pairs = meta["output_token_logprobs"]
    output_ids = [int(p[1]) for p in pairs]
    logprobs = [float(p[0]) for p in pairs]
  except (KeyError, TypeError, IndexError, ValueError) as e:
    raise ServerError(
      f"malformed /generate response ({type(e).__name__}: {e}): {body!r:.300}"
    ) from e
  reason = meta.get("finish_reason")
  reason = reason.get("type") if isinstance(reason, dict) else reason
  reason = reason if reason in ("stop", "length", "abort") else "length"
  return GenerateResult(
    rid=request.rid,
    output_ids=output_ids,
    logprobs=logprobs,
    versions=_versions(meta, len(output_ids), default_version),
    finish_reason=reason,
    prompt_len=int(meta.get("prompt_tokens", len(request.input_ids))),
  )


def _versions(meta: dict, n: int, default: int) -> list[int]:
  """Per-token versions from `weight_versions` spans, else `weight_version`, else `default`."""
  with contextlib.suppress(KeyError, TypeError, ValueError):
    out = [default] * n
    for span in meta["weight_versions"]:
      out[int(span["start"]) : int(span["end"])] = [int(span["version"])] * (
        int(span["end"]) - int(span["start"])
      )
    if len(out) == n:
      return out
  with contextlib.suppress(KeyError, TypeError, ValueError):
    return [int(meta["weight_version"])] * n
  return [default] * n


class HttpEngine(GenerateEngine):
  """`GenerateEngine` over one or more SGLang-compatible servers.

  Args:
    urls: base URLs, a list or one comma-separated string (config.rollout.urls).
    timeout_s: per-attempt HTTP timeout of /generate.
    max_retries: attempts after the first, for connection errors, timeouts and HTTP 5xx.
    backoff_s: first retry delay; doubles per attempt up to `max_backoff_s`.
    max_backoff_s: largest retry delay.
    cooldown_s: a server that failed is avoided this long (unless every server failed).
    concurrency: requests in flight at once (client threads).
    version: the weight version the servers start with.
  """

  def __init__(
    self,
    urls: str | Sequence[str],
    *,
    timeout_s: float = 600.0,
    max_retries: int = 3,
    backoff_s: float = 0.5,
    max_backoff_s: float = 10.0,
    cooldown_s: float = 5.0,
    concurrency: int = 256,
    version: int = 0,
  ):
    urls = [u.strip() for u in (urls.split(",") if isinstance(urls, str) else urls) if u.strip()]
    if not urls:
      raise ValueError("HttpEngine.urls: no server URL given")
    if max_retries < 0 or timeout_s <= 0:
      raise ValueError("HttpEngine: max_retries must be >= 0 and timeout_s > 0")
    self.servers = [_Server(u) for u in urls]
    self.timeout_s, self.max_retries = timeout_s, max_retries
    self.backoff_s, self.max_backoff_s, self.cooldown_s = backoff_s, max_backoff_s, cooldown_s
    self._version = int(version)
    self._lock = threading.Lock()
    self._turn = itertools.count()
    self._pool = concurrent.futures.ThreadPoolExecutor(concurrency, "sao-http")
    self.counters = {"requests": 0, "attempts": 0, "retries": 0, "failures": 0}

  @property
  def version(self) -> int:
    return self._version

  def submit(self, request: GenerateRequest) -> concurrent.futures.Future:
    """Queues one request (validated here); the future resolves to its GenerateResult."""
    request.check()
    with self._lock:
      self.counters["requests"] += 1
    return self._pool.submit(self._generate, request)

  def close(self) -> None:
    """Stops the client threads (in-flight HTTP calls run to their end)."""
    self._pool.shutdown(wait=False, cancel_futures=True)

  def _pick(self, avoid: _Server | None) -> _Server:
    """The healthy server with the fewest requests in flight (ties round-robin)."""
    with self._lock:
      now = time.monotonic()
      healthy = [s for s in self.servers if now - s.failed_at > self.cooldown_s and s is not avoid]
      pool = healthy or [s for s in self.servers if s is not avoid] or self.servers
      start = next(self._turn)
      order = pool[start % len(pool) :] + pool[: start % len(pool)]
      server = min(order, key=lambda s: s.inflight)
      server.inflight += 1
      self.counters["attempts"] += 1
      return server

  def _generate(self, request: GenerateRequest) -> GenerateResult:
    errors: list[str] = []
    last: _Server | None = None
    for attempt in range(self.max_retries + 1):
      if attempt:
        time.sleep(min(self.backoff_s * 2 ** (attempt - 1), self.max_backoff_s))
        with self._lock:
          self.counters["retries"] += 1
      server = self._pick(avoid=last)
      rid = f"{request.rid}.{attempt}"
      version = self._version
      try:
        body = request_json(server, "POST", "/generate", to_sglang(request, rid), self.timeout_s)
        return from_sglang(body, request, version)
      except ServerError as e:
        errors.append(str(e))
        server.failed_at, last = time.monotonic(), server
        self._abort_quietly(server, rid)
      finally:
        with self._lock:
          server.inflight -= 1
    with self._lock:
      self.counters["failures"] += 1
    raise ServerError(f"request {request.rid}: {len(errors)} attempts failed; last: {errors[-1]}")

  def _abort_quietly(self, server: _Server, rid: str) -> None:
    """Best effort: tells a server to drop an attempt whose answer we no longer wait for."""
    with contextlib.suppress(ServerError, ValueError):
      request_json(server, "POST", "/abort_request", {"rid": rid}, timeout_s=2.0)

  # ------------------------------------------------------------------------------ admin
  def _all(self, method: str, path: str, payload: Any = None, timeout_s: float = 600.0) -> list:
    return [request_json(s, method, path, payload, timeout_s) for s in self.servers]

  def update_weights_from_disk(
    self, model_path: str, version: int, *, abort_all_requests: bool = False
  ) -> None:
    """Has every server load an HF safetensors directory as weight `version`.

    Raises:
      ServerError or ValueError naming the server that failed (or said success: false).
    """
    payload = {"model_path": model_path, "weight_version": str(version),
               "abort_all_requests": abort_all_requests, "flush_cache": True}  # fmt: skip
    for server, reply in zip(
      self.servers, self._all("POST", "/update_weights_from_disk", payload), strict=True
    ):
      if isinstance(reply, dict) and reply.get("success") is False:
        raise ServerError(f"{server.url}: update_weights_from_disk failed: {reply.get('message')}")
    self._version = int(version)

  def pause_generation(self, mode: str = "in_place") -> None:
    """Pauses every server ('abort' drops in-flight requests; 'in_place'/'retract' keep them)."""
    self._all("POST", "/pause_generation", {"mode": mode})

  def continue_generation(self) -> None:
    self._all("POST", "/continue_generation", {})

  def flush_cache(self) -> None:
    self._all("POST", "/flush_cache", {})

  def health(self) -> list[bool]:
    """Per server: answered /health with 200 within 5 s."""
    out = []
    for s in self.servers:
      try:
        request_json(s, "GET", "/health", None, timeout_s=5.0)
        out.append(True)
      except (ServerError, ValueError):
        out.append(False)
    return out

  def model_info(self) -> dict:
    """/get_model_info of the first server."""
    return request_json(self.servers[0], "GET", "/get_model_info", None, timeout_s=30.0)
