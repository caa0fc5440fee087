"""Tests for sao_jax.envs.swe and swe_gen: workspaces, tools, judging, generated tasks."""

import os
import sys

import pytest

from sao_jax import data
from sao_jax.envs import swe, swe_docker, swe_gen
from sao_jax.envs import tools as tools_lib

TASKS = data.read_jsonl(str(swe.PACKAGED / "swe_boltons.jsonl"), kind="raw")
TASK = next(t for t in TASKS if t["bug"]["path"].endswith("strutils.py"))


def _call(env, name, **args):
  return env.step(tools_lib.render_call(tools_lib.ToolCall(name, args), env.tools, "qwen3"))


def test_task_records_have_swe_bench_fields():
  for t in TASKS:
    for key in (
      "instance_id",
      "repo",
      "problem_statement",
      "FAIL_TO_PASS",
      "PASS_TO_PASS",
      "test_cmd",
      "patch",
      "bug",
    ):
      assert key in t, key
    assert 1 <= len(t["FAIL_TO_PASS"]) <= 3 and not set(t["FAIL_TO_PASS"]) & set(t["PASS_TO_PASS"])
    assert t["bug"]["path"] not in t["problem_statement"]  # the location is not named
    assert t["patch"].startswith(f"--- a/{t['bug']['path']}\n+++ b/{t['bug']['path']}\n@@ -")
  assert len({t["instance_id"] for t in TASKS}) == len(TASKS)


def test_parse_pytest_report():
  out = (
    "PASSED tests/t.py::test_a\nFAILED tests/t.py::test_b - assert 1 == 2\n"
    "ERROR tests/t.py::test_c[x y]\nsomething else\n"
  )
  assert swe.parse_pytest_report(out) == {
    "tests/t.py::test_a": "PASSED",
    "tests/t.py::test_b": "FAILED",
    "tests/t.py::test_c[x y]": "ERROR",
  }


def test_mutation_enumeration():
  muts = swe_gen.mutations("def f(a, b):\n  if a < b and b == 2:\n    return a + 1\n")
  news = sorted(m[2].strip() for m in muts)
  assert "if a <= b and b == 2:" in news and "if a < b or b == 2:" in news
  assert "return a - 1" in news and "return a + 2" in news and "if a < b and b != 2:" in news


def test_tools_and_buggy_submit_scores_zero():
  env = swe.SweEnv(max_turns=10, timeout_s=30)
  messages = env.reset(TASK)
  try:
    root = env.runtime.root
    assert messages[1]["content"].startswith("<issue>\n") and root not in messages[0]["content"]
    bug = TASK["bug"]
    obs = _call(env, "view", path=bug["path"], view_range=[bug["start"], bug["start"]]).observation
    assert obs == f"{bug['start']:6d}\t{bug['new'].splitlines()[0]}"
    assert "boltons/strutils.py" in _call(env, "view", path=".").observation.split("\n")
    r = _call(env, "str_replace", path=bug["path"], old_str="no such text", new_str="x")
    assert r.observation.startswith("Error: no replacement was performed: old_str did not appear")
    r = _call(env, "str_replace", path=bug["path"], old_str="return", new_str="x")
    assert "appears" in r.observation and "times (lines [" in r.observation
    r = _call(env, "view", path="../../../etc/passwd")
    assert "outside the repository" in r.observation and r.info["tool_errors"] == 3
    assert _call(env, "create", path="notes/a.txt", file_text="hi\n").observation == (
      "File created: notes/a.txt (3 characters)"
    )
    r = env.step("<sh>cat notes/a.txt && grep -c def boltons/strutils.py >/dev/null; exit 3</sh>")
    assert r.observation == "hi\n[exit code 3]"
    r = env.step("<submit></submit>")
    assert (r.done, r.reward, r.info["finish_reason"]) == (True, 0.0, "submit")
    assert r.info["fail_to_pass"] == f"0/{len(TASK['FAIL_TO_PASS'])}"
    assert env.runtime is None and not os.path.exists(root)  # workspace deleted
  finally:
    env.close()


def test_demonstration_fix_earns_reward_one():
  demo = swe.demonstration(TASK, "compact")
  env = swe.SweEnv(tool_format="compact")
  assert env.reset(TASK)[1:] == demo[1:2]
  try:
    turns = [m for m in demo[2:]]
    for action, observation in zip(turns[0:-1:2], turns[1::2], strict=True):
      assert env.step(action["content"]).observation == observation["content"]
    assert turns[-1]["content"] == "<submit></submit>"
    r = env.step(turns[-1]["content"])
    assert (r.reward, r.info["pass_to_pass"]) == (
      1.0,
      f"{len(TASK['PASS_TO_PASS'])}/{len(TASK['PASS_TO_PASS'])}",
    )
  finally:
    env.close()


def test_editing_the_tests_earns_nothing(tmp_path):
  root = swe.prepare_workspace(TASK, str(tmp_path))
  for test in TASK["FAIL_TO_PASS"]:
    path, name = test.split("::")[0], test.split("::")[-1]
    with open(os.path.join(root, path), "a") as f:
      f.write(f"\n\ndef {name}():\n    pass\n")  # redefine the failing test as a no-op
  assert swe.evaluate(TASK, root)["reward"] == 0.0


_FAKE_DOCKER = """#!{python}
import os, shutil, subprocess, sys, uuid
state, args = os.environ["FAKE_DOCKER_STATE"], sys.argv[1:]
if args[0] == "info":
  sys.exit(0)
if args[0] == "run":
  cid = uuid.uuid4().hex[:12]
  shutil.copytree(os.environ["FAKE_DOCKER_IMAGE"], os.path.join(state, cid, "testbed"))
  print(cid)
  sys.exit(0)
if args[0] == "rm":
  shutil.rmtree(os.path.join(state, args[-1]), ignore_errors=True)
  sys.exit(0)
assert args[0] == "exec", args
args, workdir = args[1:], "/"
while args[0].startswith("-"):
  if args[0] == "-w":
    workdir, args = args[1], args[2:]
  else:
    args = args[1:]
root = os.path.join(state, args[0])
fix = lambda a: a.replace("/testbed", root + "/testbed")
cmd = [fix(a) for a in args[1:]]
r = subprocess.run(cmd, cwd=fix(workdir) if workdir != "/" else root, stdout=subprocess.PIPE)
sys.stdout.write(r.stdout.decode().replace(root + "/testbed", "/testbed"))
sys.exit(r.returncode)
"""


def test_docker_runtime_with_a_fake_engine(tmp_path, monkeypatch):
  bin_dir, state = tmp_path / "bin", tmp_path / "state"
  bin_dir.mkdir()
  state.mkdir()
  fake = bin_dir / "docker"
  fake.write_text(_FAKE_DOCKER.format(python=sys.executable))
  fake.chmod(0o755)
  image = swe.prepare_workspace(TASK, str(tmp_path / "image"))
  monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
  monkeypatch.setenv("FAKE_DOCKER_STATE", str(state))
  monkeypatch.setenv("FAKE_DOCKER_IMAGE", image)
  monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
  env = swe.SweEnv(runtime="docker", timeout_s=60)
  env.reset(dict(TASK, image="fake"))
  assert env.runtime.root == "/testbed" and len(os.listdir(state)) == 1
  bug = TASK["bug"]
  assert "boltons/strutils.py" in _call(env, "view", path=".").observation.split("\n")
  r = _call(env, "str_replace", path=bug["path"], old_str=bug["new"], new_str=bug["old"])
  assert r.observation.startswith(f"Edited {bug['path']}.")
  assert env.step("<sh>echo hi; exit 2</sh>").observation == "hi\n[exit code 2]"
  assert _call(env, "view", path="/etc/passwd").observation.startswith("Error: path '/etc/passwd'")
  r = env.step("<submit></submit>")
  assert r.reward == 1.0 and os.listdir(state) == []  # container removed


def test_docker_runtime_needs_an_engine(monkeypatch, tmp_path):
  monkeypatch.setenv("PATH", str(tmp_path))  # no docker binary at all
  with pytest.raises(RuntimeError, match="needs a running Docker engine"):
    swe.SweEnv(runtime="docker").reset(TASK)
  with pytest.raises(ValueError, match="env.runtime"):
    swe.SweEnv(runtime="k8s")
  assert swe_docker.swebench_image("django__django-11099") == (
    "swebench/sweb.eval.x86_64.django_1776_django-11099:latest"
  )


@pytest.mark.slow
def test_every_generated_task_validates():
  for task in TASKS:
    assert swe_gen.validate(task) == [], task["instance_id"]
