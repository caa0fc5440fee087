"""sao_jax.serve end to end over localhost: the SGLang schema, weight updates from an HF directory,
admin endpoints, 4xx on bad input, and `python -m sao_jax.serve` + HttpEngine + the agent loop
giving the same trajectories as the embedded engine in this process."""

import http.client
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sao_jax import data, envs, models
from sao_jax.models.hf import export_hf
from sao_jax.models.tokenizer import load_tokenizer
from sao_jax.rollout import AgentLoop, AgentSettings, Engine, GenerateRequest, HttpEngine
from sao_jax.serve import EngineServer

CFG = models.get_preset("tiny")
TOK = load_tokenizer("byte")
MAX_LEN = 128


@pytest.fixture(scope="module")
def policy():
  return models.Policy(CFG, rngs=nnx.Rngs(0))  # what `--model=preset:tiny --seed=0` builds


@pytest.fixture(scope="module")
def engine(policy):
  eng = Engine(policy, num_slots=4, max_len=MAX_LEN, seed=0)
  yield eng
  eng.close()


@pytest.fixture(scope="module")
def server(engine):
  srv = EngineServer(engine, tokenizer=TOK, model_path="preset:tiny")
  srv.start()
  yield srv
  srv.stop()


def post(url, path, payload, raw=None):
  host, port = url.split("//")[1].split(":")
  conn = http.client.HTTPConnection(host, int(port), timeout=120)
  body = raw if raw is not None else json.dumps(payload)
  conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
  resp = conn.getresponse()
  out = resp.status, json.loads(resp.read())
  conn.close()
  return out


@jax.jit
def _logits(policy, tokens_bt):
  return policy.logits(tokens_bt)


def greedy_reference(policy, prompt, n):
  ids = list(prompt)
  for _ in range(n):
    x = jnp.asarray([ids + [0] * (MAX_LEN - len(ids))])
    ids.append(int(jnp.argmax(_logits(policy, x)[0, len(ids) - 1])))
  return ids[len(prompt) :]


def test_generate_speaks_sglang(server, policy):
  prompt = TOK.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
  status, out = post(
    server.url,
    "/generate",
    {
      "input_ids": prompt,
      "sampling_params": {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True},
      "return_logprob": True,
      "rid": "abc",
    },
  )
  assert status == 200
  meta = out["meta_info"]
  assert out["output_ids"] == greedy_reference(policy, prompt, 6)
  assert [t for _, t, _ in meta["output_token_logprobs"]] == out["output_ids"]
  assert meta["finish_reason"] == {"type": "length", "length": 6}
  assert meta["prompt_tokens"] == len(prompt) and meta["completion_tokens"] == 6
  assert meta["weight_version"] == "0" and meta["id"] == "abc"
  assert meta["weight_versions"] == [{"version": 0, "start": 0, "end": 6}]
  assert out["text"] == TOK.decode(out["output_ids"])
  # A batch: lists of prompts and of sampling params, answered in order.
  status, outs = post(
    server.url,
    "/generate",
    {
      "input_ids": [prompt, prompt[:5]],
      "sampling_params": [{"max_new_tokens": 2, "temperature": 0}, {"max_new_tokens": 3}],
    },
  )
  assert status == 200 and [len(o["output_ids"]) for o in outs] == [2, 3]
  assert outs[0]["output_ids"] == out["output_ids"][:2]
  assert "output_token_logprobs" not in outs[0]["meta_info"]  # not asked for


@pytest.mark.parametrize(
  "payload,message",
  [
    ({"sampling_params": {}}, "input_ids"),
    ({"input_ids": [1, 2], "sampling_params": {"n": 2}}, "sampling_params.n"),
    ({"input_ids": [1, 2], "sampling_params": {"frobnicate": 1}}, "unknown keys"),
    ({"input_ids": [1, 10_000]}, "input_ids"),
    ({"input_ids": [1, 2], "sampling_params": {"top_p": 2.0}}, "top_p"),
    ({"input_ids": list(range(MAX_LEN))}, "max_len"),
  ],
)
def test_bad_requests_get_400_with_the_field(server, payload, message):
  status, out = post(server.url, "/generate", payload)
  assert status == 400 and message in out["error"]["message"]


def test_bad_json_unknown_route_and_bad_weights(server, tmp_path):
  assert post(server.url, "/generate", None, raw="{not json")[0] == 400
  assert post(server.url, "/nope", {})[0] == 404
  status, out = post(server.url, "/update_weights_from_disk", {"model_path": str(tmp_path)})
  assert status == 400 and "config.json" in out["error"]["message"]


def test_admin_endpoints(server, engine):
  client = HttpEngine(server.url)
  assert client.health() == [True]
  info = client.model_info()
  assert (info["vocab_size"], info["max_len"], info["num_slots"]) == (CFG.vocab_size, MAX_LEN, 4)
  client.flush_cache()
  client.pause_generation("in_place")
  future = client.submit(GenerateRequest([1, 2, 3], max_new_tokens=3, temperature=0))
  with pytest.raises(TimeoutError):
    future.result(timeout=0.5)  # held while paused
  client.continue_generation()
  assert len(future.result(timeout=60).output_ids) == 3
  client.close()


def test_update_weights_from_disk(server, engine, policy, tmp_path):
  new_policy = models.Policy(CFG, rngs=nnx.Rngs(1))
  export_hf(new_policy, str(tmp_path / "v5"))
  client = HttpEngine(server.url)
  try:
    client.update_weights_from_disk(str(tmp_path / "v5"), version=5)
    assert client.version == 5
    prompt = [10, 20, 30, 40]
    r = client.generate([GenerateRequest(prompt, max_new_tokens=8, temperature=0)])[0]
    assert r.versions == [5] * 8
    assert r.output_ids == greedy_reference(new_policy, prompt, 8)
    assert r.output_ids != greedy_reference(policy, prompt, 8)
  finally:
    engine.update_weights(policy, version=0)
    client.close()


def test_serve_decode_windows_flag():
  from sao_jax.serve import _parse

  assert _parse(["--model=preset:tiny", "--decode-windows=128, 512"]).decode_windows == (128, 512)
  assert _parse(["--model=preset:tiny"]).decode_windows == ()
  for bad in ("64,x", "0"):
    with pytest.raises(SystemExit):
      _parse(["--model=preset:tiny", f"--decode-windows={bad}"])


def test_python_m_serve_with_http_client_and_agent_loop_matches_the_embedded_engine(engine):
  proc = subprocess.Popen(
    [sys.executable, "-m", "sao_jax.serve", "--model=preset:tiny", "--tokenizer=byte",
     "--port=0", f"--max-len={MAX_LEN}", "--num-slots=4", "--seed=0",
     "--decode-windows=32,96"],  # the fixture's engine uses the default (64, 128): same outputs
    stdout=subprocess.PIPE,
    text=True,
    env={**os.environ, "XLA_FLAGS": ""},
  )  # fmt: skip
  try:
    port = int(proc.stdout.readline())
    client = HttpEngine(f"http://127.0.0.1:{port}", timeout_s=300)
    factory = envs.make(dict(name="math_tool", tool_format="compact", max_turns=2))
    settings = AgentSettings(max_turns=2, max_seq_len=MAX_LEN, max_new_tokens=12, concurrency=4)
    tasks = [data.arith_task(0, "train", i, 1) for i in range(4)]
    over_http = AgentLoop(client, TOK, factory, settings).run(tasks, seed=3)
    embedded = AgentLoop(engine, TOK, factory, settings).run(tasks, seed=3)
    for a, b in zip(over_http, embedded, strict=True):
      assert a.uid == b.uid and a.metadata["finish_reason"] == b.metadata["finish_reason"]
      np.testing.assert_array_equal(a.tokens, b.tokens)
      np.testing.assert_array_equal(a.action_mask, b.action_mask)
      np.testing.assert_array_equal(a.rollout_logprobs, b.rollout_logprobs)
      np.testing.assert_array_equal(a.policy_versions, b.policy_versions)
      assert a.validate(vocab_size=CFG.vocab_size, max_len=MAX_LEN) is None
    assert sum(t.num_action_tokens for t in over_http) >= 4 * 12
    client.close()
  finally:
    proc.terminate()
    assert proc.wait(timeout=30) == 0
