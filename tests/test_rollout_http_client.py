"""HttpEngine against fake SGLang servers: the SGLang wire format, load balancing, retries with
backoff on 5xx / dropped connections / timeouts, no retry on 4xx, and no episode counted twice."""

import http.server
import json
import threading
import time

import pytest

from sao_jax.rollout import AgentLoop, AgentSettings, GenerateRequest, HttpEngine, ServerError
from sao_jax.rollout.http_client import from_sglang, to_sglang


class FakeServer:
  """A local SGLang-like /generate: echoes the last prompt token + 1, `n` times.

  `fail(i, body)` may return 'drop' (close without answering), 'sleep' (answer late), an int
  status (answer with that error), or None (answer normally) for the i-th /generate call.
  """

  def __init__(self, fail=lambda i, body: None, version="0", delay=0.0):
    self.calls, self.aborts, self.fail, self.version, self.delay = [], [], fail, version, delay
    self.lock = threading.Lock()
    outer = self

    class Handler(http.server.BaseHTTPRequestHandler):
      protocol_version = "HTTP/1.1"

      def log_message(self, *args):
        pass

      def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/abort_request":
          outer.aborts.append(body["rid"])
          return self.reply(200, {"success": True})
        with outer.lock:
          i = len(outer.calls)
          outer.calls.append(body)
        time.sleep(outer.delay)
        action = outer.fail(i, body)
        if action == "drop":
          self.close_connection = True
          return  # no response at all
        if action == "sleep":
          time.sleep(1.0)
        if isinstance(action, int):
          return self.reply(action, {"error": {"message": f"status {action}"}})
        self.reply(200, outer.answer(body))

      def do_GET(self):
        self.reply(200, {"status": "ok"})

      def reply(self, status, payload):
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    self.httpd.daemon_threads = True
    threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()
    self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

  def answer(self, body):
    sp = body["sampling_params"]
    n = sp["max_new_tokens"]
    out = [(body["input_ids"][-1] + 1 + i) % 256 for i in range(n)]
    meta = {
      "id": body["rid"],
      "finish_reason": {"type": "length", "length": n},
      "prompt_tokens": len(body["input_ids"]),
      "output_token_logprobs": [[-0.25, t, None] for t in out],
      "weight_version": self.version,
    }
    return {"text": "", "output_ids": out, "meta_info": meta}

  def close(self):
    self.httpd.shutdown()
    self.httpd.server_close()


@pytest.fixture
def servers():
  made = []
  yield lambda **kw: made.append(FakeServer(**kw)) or made[-1]
  for s in made:
    s.close()


def test_wire_format_round_trip():
  req = GenerateRequest([5, 6], max_new_tokens=3, temperature=0.7, top_k=0, seed=2**40, rid="r")
  body = to_sglang(req, "r.0")
  assert (
    body["sampling_params"]["top_k"] == -1 and body["sampling_params"]["sampling_seed"] == 2**40
  )
  assert body["return_logprob"] is True and body["rid"] == "r.0"
  meta = {
    "finish_reason": {"type": "stop", "matched": 9},
    "output_token_logprobs": [[-0.1, 7, None], [-0.2, 8, "x"], [-0.3, 9, None]],
    "weight_versions": [{"version": 4, "start": 0, "end": 2}, {"version": 5, "start": 2, "end": 3}],
    "prompt_tokens": 2,
  }
  r = from_sglang({"meta_info": meta}, req, default_version=0)
  assert (r.output_ids, r.logprobs, r.versions) == ([7, 8, 9], [-0.1, -0.2, -0.3], [4, 4, 5])
  assert r.finish_reason == "stop" and r.prompt_len == 2 and r.rid == "r"
  meta = {**meta, "weight_versions": None, "weight_version": "default", "finish_reason": "length"}
  r = from_sglang({"meta_info": meta}, req, default_version=11)
  assert r.versions == [11, 11, 11] and r.finish_reason == "length"
  with pytest.raises(ServerError, match="malformed"):
    from_sglang({"meta_info": {}}, req, 0)


def test_requests_are_spread_over_servers(servers):
  a, b = servers(delay=0.05), servers(delay=0.05)
  engine = HttpEngine([a.url, b.url])
  results = engine.generate([GenerateRequest([i], max_new_tokens=2) for i in range(20)])
  assert [r.output_ids for r in results] == [[(i + 1) % 256, (i + 2) % 256] for i in range(20)]
  assert len(a.calls) + len(b.calls) == 20 and min(len(a.calls), len(b.calls)) >= 7
  engine.close()


@pytest.mark.parametrize("failure", [503, "drop"])
def test_server_failures_are_retried_once_per_attempt(servers, failure):
  flaky = servers(fail=lambda i, body: failure if i == 0 else None, version="3")
  engine = HttpEngine(flaky.url, backoff_s=0.01)
  r = engine.generate([GenerateRequest([1, 2], max_new_tokens=2, rid="x")])[0]
  assert r.output_ids == [3, 4] and r.versions == [3, 3] and r.rid == "x"
  assert [c["rid"] for c in flaky.calls] == ["x.0", "x.1"]  # one new attempt, same seed
  assert flaky.calls[0]["sampling_params"] == flaky.calls[1]["sampling_params"]
  assert engine.counters == {"requests": 1, "attempts": 2, "retries": 1, "failures": 0}
  assert flaky.aborts == ["x.0"]  # the lost attempt is told to stop


def test_a_timeout_moves_to_another_server(servers):
  slow = servers(fail=lambda i, body: "sleep")
  fast = servers()
  engine = HttpEngine([slow.url, fast.url], timeout_s=0.3, backoff_s=0.01, max_retries=2)
  results = engine.generate([GenerateRequest([7], max_new_tokens=1, rid=f"q{i}") for i in range(4)])
  assert [r.output_ids for r in results] == [[8]] * 4
  assert len(fast.calls) >= 4 and all(
    c["rid"].endswith(".1") for c in fast.calls[-len(slow.calls) :]
  )


def test_exhausted_retries_raise_and_4xx_is_not_retried(servers):
  down = servers(fail=lambda i, body: 500)
  engine = HttpEngine(down.url, max_retries=2, backoff_s=0.01)
  with pytest.raises(ServerError, match="3 attempts"):
    engine.generate([GenerateRequest([1], max_new_tokens=1)])
  bad = servers(fail=lambda i, body: 400)
  engine = HttpEngine(bad.url, backoff_s=0.01)
  with pytest.raises(ValueError, match="HTTP 400: status 400"):
    engine.generate([GenerateRequest([1], max_new_tokens=1)])
  assert len(bad.calls) == 1
  with pytest.raises(ValueError, match="urls"):
    HttpEngine("")


class _OneStepEnv:
  name = "one"

  def reset(self, task):
    return [dict(role="user", content="go")]

  def step(self, action):
    from sao_jax.envs.base import StepResult

    return StepResult(None, 1.0, True, {"finish_reason": "answer"})


def test_no_episode_is_counted_twice_after_retries(servers):
  """Every third attempt is lost after the server did the work; each episode is still one result."""
  from sao_jax.models.tokenizer import load_tokenizer

  flaky = servers(fail=lambda i, body: "drop" if i % 3 == 0 else None)
  engine = HttpEngine(flaky.url, backoff_s=0.01)
  loop = AgentLoop(
    engine,
    load_tokenizer("byte"),
    _OneStepEnv,
    AgentSettings(max_turns=1, max_seq_len=128, max_new_tokens=4, concurrency=4),
  )
  tasks = [dict(id=f"t{i}") for i in range(12)]
  trajs = loop.run(tasks, seed=1)
  assert [t.prompt_id for t in trajs] == [t["id"] for t in tasks]
  assert len({t.uid for t in trajs}) == 12
  assert all(t.num_action_tokens == 4 for t in trajs)
  assert engine.counters["requests"] == 12 and engine.counters["retries"] >= 4
  assert len(flaky.calls) == 12 + engine.counters["retries"]
