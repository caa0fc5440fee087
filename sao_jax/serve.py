"""An SGLang-compatible HTTP server on the embedded JAX engine (for TPU/CPU rollout hosts).

    python -m sao_jax.serve --model=PATH --port=N [--host=127.0.0.1] [--num-slots=16]
        [--max-len=2048] [--tokenizer=model|byte|PATH] [--version=0]

`--model` is a Hugging Face directory or a .gguf file (or `preset:NAME` for a randomly initialized
preset, for tests). Prints the bound port on one line (`--port=0` picks a free one), then serves
until SIGINT/SIGTERM. It speaks the subset of SGLang's HTTP API that RL uses (see
docs/stack.md), with SGLang's field names, so `HttpEngine` drives it and SGLang servers alike:

  POST /generate                 {input_ids | text, sampling_params, return_logprob, rid}
                                 -> {text, output_ids, meta_info: {id, finish_reason, prompt_tokens,
                                     completion_tokens, output_token_logprobs, weight_version, ...}}
  POST /update_weights_from_disk {model_path, weight_version}  (an HF safetensors directory)
  GET|POST /flush_cache          (no prefix cache here: always succeeds)
  POST /pause_generation         {mode: 'abort' | 'retract' | 'in_place'};  POST /continue_generation
  POST /abort_request {rid};  GET /health;  GET /get_model_info;  GET /get_server_info

A batch (`input_ids` as a list of lists) is submitted to the engine at once, and concurrent HTTP
requests are served by threads that all feed the same engine, so they are batched together.
Malformed requests get HTTP 400 with {"error": {"message": ...}} naming the field.
"""

from __future__ import annotations

import argparse
import http.server
import json
import signal
import sys
import threading
from typing import Any

from sao_jax.rollout.protocol import GenerateRequest, GenerateResult

_SAMPLING_KEYS = {"max_new_tokens", "temperature", "top_p", "top_k", "stop_token_ids", "ignore_eos",
                  "sampling_seed", "seed"}  # fmt: skip
# Accepted only at their neutral value (anything else would silently change the distribution).
_NEUTRAL = {"n": 1, "min_p": 0.0, "min_new_tokens": 0, "repetition_penalty": 1.0,
            "frequency_penalty": 0.0, "presence_penalty": 0.0, "stop": None, "json_schema": None,
            "regex": None, "ebnf": None}  # fmt: skip
_IGNORED = {"skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim", "logit_bias",
            "custom_params"}  # fmt: skip


class BadRequest(ValueError):
  """A client error: answered with HTTP 400 and this message."""


def parse_sampling(params: Any, *, eos_ids: tuple[int, ...]) -> dict[str, Any]:
  """GenerateRequest fields from SGLang `sampling_params`.

  Args:
    params: the request's sampling_params dict (None: defaults).
    eos_ids: the model's end tokens, added to the stop ids unless `ignore_eos`.

  Returns:
    Keyword arguments of GenerateRequest (without input_ids and rid).
  """
  params = dict(params or {})
  if not isinstance(params, dict):
    raise BadRequest("sampling_params: must be an object")
  for key, neutral in _NEUTRAL.items():
    value = params.pop(key, neutral)
    if value != neutral and not (key == "stop" and value in ([], "")):
      raise BadRequest(f"sampling_params.{key}={value!r} is not supported by sao_jax.serve")
  unknown = set(params) - _SAMPLING_KEYS - _IGNORED
  if unknown:
    raise BadRequest(f"sampling_params: unknown keys {sorted(unknown)}")
  try:
    top_k = int(params.get("top_k", 0))
    stops = [int(t) for t in params.get("stop_token_ids") or []]
    out = dict(
      max_new_tokens=int(params.get("max_new_tokens", 128)),
      temperature=float(params.get("temperature", 1.0)),
      top_p=float(params.get("top_p", 1.0)),
      top_k=0 if top_k < 0 else top_k,  # SGLang: -1 = off
      seed=int(params.get("sampling_seed", params.get("seed", 0)) or 0),
    )
  except (TypeError, ValueError) as e:
    raise BadRequest(f"sampling_params: {e}") from None
  if not params.get("ignore_eos", False):
    stops += [t for t in eos_ids if t not in stops]
  out["stop_token_ids"] = stops
  return out


def parse_generate(body: Any, *, tokenizer: Any, eos_ids: tuple[int, ...]):
  """Requests of a /generate body.

  Returns:
    (list of GenerateRequest, batched: whether the body held a batch, return_logprob).
  """
  if not isinstance(body, dict):
    raise BadRequest("body: must be a JSON object")
  ids = body.get("input_ids")
  if ids is None and body.get("text") is not None:
    if tokenizer is None:
      raise BadRequest("text: this server has no tokenizer; send input_ids")
    text = body["text"]
    ids = [tokenizer.encode(t) for t in text] if isinstance(text, list) else tokenizer.encode(text)
  if not isinstance(ids, list) or not ids:
    raise BadRequest("input_ids: must be a non-empty list of token ids (or a list of such lists)")
  batched = isinstance(ids[0], list)
  prompts = ids if batched else [ids]
  n = len(prompts)
  params = body.get("sampling_params")
  params = params if isinstance(params, list) else [params] * n
  rids = body.get("rid")
  rids = rids if isinstance(rids, list) else [rids] * n
  if len(params) != n or len(rids) != n:
    raise BadRequest(f"sampling_params/rid: {len(params)} and {len(rids)} entries for {n} prompts")
  requests = []
  for i, (prompt, p, rid) in enumerate(zip(prompts, params, rids, strict=True)):
    if not isinstance(prompt, list) or not all(isinstance(t, int) for t in prompt):
      raise BadRequest(f"input_ids[{i}]: must be a list of integers")
    kwargs = parse_sampling(p, eos_ids=eos_ids)
    requests.append(GenerateRequest(input_ids=prompt, rid=str(rid) if rid else "", **kwargs))
  return requests, batched, bool(body.get("return_logprob", False))


def format_result(result: GenerateResult, *, return_logprob: bool, tokenizer: Any) -> dict:
  """The SGLang /generate response of one result."""
  reason: dict[str, Any] = {"type": result.finish_reason}
  if result.finish_reason == "stop":
    reason["matched"] = result.output_ids[-1]
  elif result.finish_reason == "length":
    reason["length"] = len(result.output_ids)
  meta: dict[str, Any] = {
    "id": result.rid,
    "finish_reason": reason,
    "prompt_tokens": result.prompt_len,
    "completion_tokens": len(result.output_ids),
    "cached_tokens": 0,
    "weight_version": str(result.versions[-1] if result.versions else ""),
    "weight_versions": _version_spans(result.versions),
    "e2e_latency": result.timings.get("total", 0.0),
  }
  if return_logprob:
    meta["output_token_logprobs"] = [
      [lp, t, None] for lp, t in zip(result.logprobs, result.output_ids, strict=True)
    ]
  text = tokenizer.decode(result.output_ids) if tokenizer is not None else ""
  return {"text": text, "output_ids": result.output_ids, "meta_info": meta}


def _version_spans(versions: list[int]) -> list[dict[str, int]]:
  """[{version, start, end}] runs of equal versions over the output tokens (end exclusive)."""
  spans: list[dict[str, int]] = []
  for i, v in enumerate(versions):
    if spans and spans[-1]["version"] == v:
      spans[-1]["end"] = i + 1
    else:
      spans.append({"version": v, "start": i, "end": i + 1})
  return spans


class EngineServer:
  """The HTTP front of an `Engine` (one ThreadingHTTPServer; a thread per connection).

  Args:
    engine: a running `sao_jax.rollout.Engine`.
    tokenizer: a `models.Tokenizer` for `text` inputs and outputs, or None.
    model_path: reported by /get_model_info.
    host: interface to bind.
    port: port to bind (0: a free one).
    load_weights: `path -> params` for /update_weights_from_disk (default: models.from_pretrained,
      keeping the engine's parameter dtype).
  """

  def __init__(self, engine, *, tokenizer=None, model_path: str = "", host: str = "127.0.0.1",
               port: int = 0, load_weights=None):  # fmt: skip
    self.engine, self.tokenizer, self.model_path = engine, tokenizer, model_path
    self.eos_ids = tuple(tokenizer.stop_ids) if tokenizer is not None else ()
    if not self.eos_ids and engine.cfg.eos_id is not None:
      self.eos_ids = (engine.cfg.eos_id,)
    self.load_weights = load_weights or self._from_pretrained
    self._update_lock = threading.Lock()
    handler = type("Handler", (_Handler,), {"server_obj": self})
    self.httpd = http.server.ThreadingHTTPServer((host, port), handler)
    self.httpd.daemon_threads = True
    self._thread: threading.Thread | None = None

  @property
  def port(self) -> int:
    return self.httpd.server_address[1]

  @property
  def url(self) -> str:
    return f"http://{self.httpd.server_address[0]}:{self.port}"

  def start(self) -> int:
    """Serves in a background thread; returns the bound port."""
    self._thread = threading.Thread(
      target=self.httpd.serve_forever, args=(0.1,), name="sao-serve", daemon=True
    )
    self._thread.start()
    return self.port

  def stop(self) -> None:
    """Stops serving (the engine is left running; close it separately)."""
    self.httpd.shutdown()
    self.httpd.server_close()

  def _from_pretrained(self, path: str):
    from sao_jax import models  # heavy; only on weight updates

    dtype = self.engine.cfg.param_dtype
    return models.from_pretrained(path, dtype=self.engine.cfg.dtype, param_dtype=dtype)

  # ------------------------------------------------------------------------------ endpoints
  def generate(self, body: Any) -> Any:
    requests, batched, return_logprob = parse_generate(
      body, tokenizer=self.tokenizer, eos_ids=self.eos_ids
    )
    try:
      futures = [self.engine.submit(r) for r in requests]
    except ValueError as e:
      raise BadRequest(str(e)) from None
    out = [
      format_result(f.result(), return_logprob=return_logprob, tokenizer=self.tokenizer)
      for f in futures
    ]
    return out if batched else out[0]

  def update_weights_from_disk(self, body: Any) -> dict:
    if not isinstance(body, dict) or not body.get("model_path"):
      raise BadRequest("model_path: required (an HF safetensors directory)")
    version = body.get("weight_version")
    with self._update_lock:
      try:
        version = self.engine.version + 1 if version in (None, "") else int(version)
      except (TypeError, ValueError):
        raise BadRequest(f"weight_version: must be an integer, got {version!r}") from None
      if body.get("abort_all_requests", False):
        self.engine.abort()
      try:
        params = self.load_weights(str(body["model_path"]))
        self.engine.update_weights(params, version)
      except (OSError, ValueError, KeyError) as e:
        raise BadRequest(f"update_weights_from_disk: {e}") from None
    return {"success": True, "message": f"weights updated to version {version}",
            "num_paused_requests": 0}  # fmt: skip

  def pause(self, body: Any) -> dict:
    mode = (body or {}).get("mode", "abort") if isinstance(body, dict) else "abort"
    if mode not in ("abort", "retract", "in_place"):
      raise BadRequest(f"mode: must be 'abort', 'retract' or 'in_place', got {mode!r}")
    self.engine.pause()
    if mode == "abort":
      self.engine.abort()
    return {"success": True, "message": f"paused ({mode})"}

  def abort_request(self, body: Any) -> dict:
    rid = body.get("rid") if isinstance(body, dict) else None
    if not rid:
      raise BadRequest("rid: required")
    return {"success": True, "aborted": self.engine.abort([str(rid)])}

  def model_info(self) -> dict:
    cfg = self.engine.cfg
    return {
      "model_path": self.model_path,
      "tokenizer_path": self.model_path,
      "is_generation": True,
      "weight_version": str(self.engine.version),
      "vocab_size": cfg.vocab_size,
      "max_len": self.engine.max_len,
      "num_slots": self.engine.num_slots,
      "eos_token_ids": list(self.eos_ids),
    }

  def route(self, method: str, path: str, body: Any) -> tuple[int, Any]:
    """(status, JSON payload) of one request."""
    e = self.engine
    routes = {
      ("POST", "/generate"): lambda: self.generate(body),
      ("POST", "/update_weights_from_disk"): lambda: self.update_weights_from_disk(body),
      ("GET", "/flush_cache"): lambda: "Cache flushed.",
      ("POST", "/flush_cache"): lambda: "Cache flushed.",
      ("POST", "/pause_generation"): lambda: self.pause(body),
      ("POST", "/continue_generation"): lambda: (e.resume(), {"success": True})[1],
      ("POST", "/abort_request"): lambda: self.abort_request(body),
      ("GET", "/health"): lambda: {"status": "ok", "weight_version": str(e.version)},
      ("GET", "/get_model_info"): self.model_info,
      ("GET", "/get_server_info"): lambda: {**self.model_info(), **e.stats()},
    }
    fn = routes.get((method, path))
    if fn is None:
      return 404, {"error": {"message": f"no route {method} {path}"}}
    try:
      return 200, fn()
    except BadRequest as err:
      return 400, {"error": {"message": str(err)}}
    except Exception as err:
      return 500, {"error": {"message": f"{type(err).__name__}: {err}"}}


class _Handler(http.server.BaseHTTPRequestHandler):
  server_obj: EngineServer
  protocol_version = "HTTP/1.1"

  def log_message(self, *args):  # quiet: one line per request would flood rollout logs
    pass

  def _serve(self, method: str):
    body = None
    length = int(self.headers.get("Content-Length") or 0)
    if length:
      try:
        body = json.loads(self.rfile.read(length))
      except json.JSONDecodeError as e:
        return self._reply(400, {"error": {"message": f"body: invalid JSON ({e})"}})
    path = self.path.split("?", 1)[0]
    if path == "/health" and self.server_obj.engine.stats().get("failed"):
      return self._reply(503, {"error": {"message": "engine thread failed"}})
    status, payload = self.server_obj.route(method, path, body)
    self._reply(status, payload)

  def _reply(self, status: int, payload: Any):
    data = json.dumps(payload).encode()
    self.send_response(status)
    self.send_header("Content-Type", "application/json")
    self.send_header("Content-Length", str(len(data)))
    self.end_headers()
    self.wfile.write(data)

  def do_GET(self):
    self._serve("GET")

  def do_POST(self):
    self._serve("POST")


def _windows(text: str) -> tuple[int, ...]:
  """'128,512' -> (128, 512); argparse reports anything else as a bad --decode-windows value."""
  from sao_jax.config import int_list

  try:
    windows = int_list(text)
  except ValueError:
    raise argparse.ArgumentTypeError(f"comma-separated integers, got {text!r}") from None
  if any(w < 1 for w in windows):
    raise argparse.ArgumentTypeError(f"windows must be >= 1, got {text!r}")
  return windows


def _parse(argv: list[str] | None) -> argparse.Namespace:
  p = argparse.ArgumentParser(prog="python -m sao_jax.serve", description=__doc__.split("\n")[0])
  p.add_argument("--model", required=True, help="HF directory, .gguf file, or preset:NAME")
  p.add_argument("--port", type=int, default=30000, help="port to bind (0: a free one)")
  p.add_argument("--host", default="127.0.0.1", help="interface ('0.0.0.0' for remote learners)")
  p.add_argument("--tokenizer", default="model", help="'model' (from --model), 'byte', or a path")
  p.add_argument("--num-slots", type=int, default=16, help="sequences decoded together")
  p.add_argument("--max-len", type=int, default=2048, help="most tokens per sequence")
  p.add_argument("--prefill-batch", type=int, default=1, help="prompts per prefill call")
  p.add_argument("--decode-windows", type=_windows, default=(),
                 help="comma-separated cache lengths a decode step may attend to, each compiled "
                      "once (--max-len is always one; default 64, 128, 256, ...)")  # fmt: skip
  p.add_argument("--dtype", default="float32", help="compute and parameter dtype")
  p.add_argument("--version", type=int, default=0, help="weight version of --model")
  p.add_argument("--seed", type=int, default=0, help="engine sampling seed")
  return p.parse_args(argv)


def _load(args: argparse.Namespace):
  """(policy, tokenizer or None) for the command line."""
  from flax import nnx  # keep `--help` fast

  from sao_jax import models

  if args.model.startswith("preset:"):
    policy = models.Policy(models.get_preset(args.model.split(":", 1)[1]), rngs=nnx.Rngs(args.seed))
  else:
    policy = models.from_pretrained(args.model, dtype=args.dtype)
  spec = args.tokenizer
  if spec == "model":
    spec = None if args.model.startswith("preset:") else args.model
  return policy, (models.load_tokenizer(spec) if spec else None)


def main(argv: list[str] | None = None) -> int:
  args = _parse(argv)
  from sao_jax.rollout.engine import Engine

  policy, tokenizer = _load(args)
  engine = Engine(policy, num_slots=args.num_slots, max_len=args.max_len,
                  decode_windows=args.decode_windows or None, prefill_batch=args.prefill_batch,
                  seed=args.seed, version=args.version)  # fmt: skip
  server = EngineServer(engine, tokenizer=tokenizer, model_path=args.model, host=args.host,
                        port=args.port)  # fmt: skip
  print(server.start(), flush=True)
  done = threading.Event()
  for sig in (signal.SIGINT, signal.SIGTERM):
    signal.signal(sig, lambda *_: done.set())
  while not done.wait(1.0):
    pass
  server.stop()
  engine.close()
  return 0


if __name__ == "__main__":
  sys.exit(main())
