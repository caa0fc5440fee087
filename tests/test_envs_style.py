"""Tests for sao_jax.envs.style and judges: schedule, judge accuracy, rewards, the LLM client."""

import http.server
import json
import threading
import typing

import numpy as np
import pytest

from sao_jax import data, envs
from sao_jax.envs import judges, style

JUDGE = judges.LocalStyleJudge()


def test_schedule_switches_and_pools():
  s = style.StyleSchedule((150, 300))
  assert [s.preferred(t) for t in (0, 149, 150, 299, 300, 10_000)] == [
    "cute",
    "cute",
    "chuunibyou",
    "chuunibyou",
    "classical",
    "classical",
  ]
  assert s.pool(0) == ("academic", "cute", "chuunibyou") and s.pool(300) == (
    "classical",
    "cute",
    "chuunibyou",
  )
  with pytest.raises(ValueError, match="style_switch_steps"):
    style.StyleSchedule((300, 150))


def test_local_judge_held_out_accuracy():
  held = judges.split_refs(held_out=True)
  per_class = {
    c: np.mean([JUDGE.classify(t, judges.STYLES) == c for t in texts]) for c, texts in held.items()
  }
  overall = np.mean([JUDGE.classify(t, judges.STYLES) == c for c, ts in held.items() for t in ts])
  assert overall >= 0.85, per_class  # measured 0.8875 (docs/envs.md)
  assert min(per_class.values()) >= 0.75, per_class
  assert JUDGE.classify(held["classical"][0], ("academic", "cute")) in ("academic", "cute", "plain")


def test_judge_is_deterministic():
  assert judges.LocalStyleJudge().scores("Hehe so cute!") == JUDGE.scores("Hehe so cute!")


def test_quality():
  assert judges.quality("The moon was bright over the quiet town last night.", "the moon")
  assert not judges.quality("The sun was bright over the quiet town last night.", "the moon")
  assert not judges.quality("moon moon moon moon moon moon moon moon moon moon", "the moon")
  assert not judges.quality("moon", "the moon")
  assert not judges.quality("xqzt vbnm qwrt zxcv moon plmk trew", "the moon")


def test_env_rewards_follow_the_preference():
  factory = envs.make(dict(name="style", style_switch_steps=(10, 20)))
  task = dict(id="s", prompt="Write a short paragraph about the moon.", topic="the moon")
  rng = __import__("random").Random(0)
  texts = {s: style.write_in_style("the moon", s, rng) for s in judges.STYLES}
  rewards = {}
  for step in (0, 10, 20):
    factory.set_step(step)
    for s, text in texts.items():
      env = factory()
      env.reset(task)
      r = env.step(text)
      assert r.done and r.info["preferred"] == style.PHASES[step // 10]
      rewards[step, s] = r.reward
  assert {k for k, v in rewards.items() if v == 1.0} == {
    (0, "cute"),
    (10, "chuunibyou"),
    (20, "classical"),
  }
  env = factory()
  env.reset(dict(task, step=25))  # a task may pin the step
  assert env.step(texts["classical"]).reward == 1.0


@pytest.mark.parametrize("topic_check,reward", [(True, 0.0), (False, 1.0)])
def test_topic_check_can_be_turned_off(topic_check, reward):
  factory = envs.make(dict(name="style", style_topic_check=topic_check))
  env = factory()
  env.reset(dict(id="s", prompt="Write a short paragraph about the moon.", topic="the moon"))
  text = style.write_in_style("a lake", "cute", __import__("random").Random(0))  # wrong topic
  r = env.step(text)
  assert (r.reward, r.info["r_style"]) == (reward, 1.0)


@pytest.mark.parametrize("sentences", [1, 3])
def test_demonstrations_cover_all_styles_and_are_judged_right(sentences):
  tasks = data.style_prompts()
  demos = [style.demonstration(t, sentences=sentences) for t in tasks]
  assert [m["role"] for m in demos[0]] == ["system", "user", "assistant"]
  seen = set()
  for task, demo in zip(tasks, demos, strict=True):
    text = demo[-1]["content"]
    s = JUDGE.classify(text, judges.STYLES)
    seen.add(s)
    assert judges.quality(text, task["topic"]), text
  assert seen == set(judges.STYLES)


def test_write_in_style_sentence_count():
  rng = __import__("random").Random(0)
  one = style.write_in_style("the moon", "classical", rng, sentences=1)
  assert one in [t.format(t="the moon", T="The moon") for t in style._TEMPLATES["classical"]]
  four = style.write_in_style("the moon", "classical", rng, sentences=4)
  assert all(t.format(t="the moon", T="The moon") in four for t in style._TEMPLATES["classical"])
  with pytest.raises(ValueError, match="sentences"):
    style.write_in_style("the moon", "cute", rng, sentences=5)


class _FakeLLM(http.server.BaseHTTPRequestHandler):
  requests: typing.ClassVar[list] = []

  def do_POST(self):
    body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
    _FakeLLM.requests.append((self.path, body, self.headers.get("Authorization")))
    text = body["messages"][1]["content"]
    verdict = {"style": "cute" if "hehe" in text.lower() else "academic", "quality": 1}
    payload = {"choices": [{"message": {"content": "Verdict: " + json.dumps(verdict)}}]}
    raw = json.dumps(payload).encode()
    self.send_response(200)
    self.send_header("Content-Type", "application/json")
    self.send_header("Content-Length", str(len(raw)))
    self.end_headers()
    self.wfile.write(raw)

  def log_message(self, *args):
    pass


def test_llm_judge_against_a_local_openai_compatible_server():
  server = http.server.HTTPServer(("127.0.0.1", 0), _FakeLLM)
  thread = threading.Thread(target=server.serve_forever, daemon=True)
  thread.start()
  try:
    url = f"http://127.0.0.1:{server.server_port}"
    judge = judges.LLMStyleJudge(url, model="m", api_key="k", timeout_s=10)
    task = dict(prompt="Write about tea.", topic="tea")
    pool = ("academic", "cute", "chuunibyou")
    v = judge.judge("Hehe tea!", task=task, preferred="cute", pool=pool)
    assert v == dict(r_quality=1.0, r_style=1.0, style="cute")
    v = judge.judge("Tea is studied.", task=task, preferred="cute", pool=pool)
    assert v == dict(r_quality=1.0, r_style=0.0, style="academic")
    path, body, auth = _FakeLLM.requests[0]
    assert (path, body["model"], auth) == ("/v1/chat/completions", "m", "Bearer k")
    assert "academic, cute, chuunibyou, plain" in body["messages"][0]["content"]
    factory = envs.make(dict(name="style", style_judge="llm", judge_url=url))
    env = factory()
    env.reset(dict(task, id="x"))
    assert env.step("hehe").reward == 1.0
  finally:
    server.shutdown()
  with pytest.raises(ValueError, match="judge_url"):
    judges.LLMStyleJudge("")
