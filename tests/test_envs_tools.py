"""Tests for sao_jax.envs.tools and the ToolEnv loop in sao_jax.envs.base."""

import json

import pytest

from sao_jax.envs import base, sandbox, tools

PY = tools.Tool("python", "run code", {"code": {"type": "string"}}, ("code",), "py", "code")
SUBMIT = tools.Tool("submit", "finish", {}, (), "submit")
TOOLS = [PY, SUBMIT]


def test_parse_qwen3_and_compact_in_order():
  text = (
    'think <py>print(1)</py> then <tool_call>\n{"name": "python", "arguments": '
    '{"code": "print(2)"}}\n</tool_call> done'
  )
  p = tools.parse_action(text, TOOLS)
  assert p.calls == (
    tools.ToolCall("python", {"code": "print(1)"}),
    tools.ToolCall("python", {"code": "print(2)"}),
  )
  assert p.errors == () and p.text == "think  then  done"


def test_parse_unterminated_call_at_end_and_string_arguments():
  p = tools.parse_action("<py>print(3)", TOOLS)
  assert p.calls == (tools.ToolCall("python", {"code": "print(3)"}),)
  body = json.dumps({"name": "python", "arguments": json.dumps({"code": "x"})})
  assert tools.parse_action(f"<tool_call>{body}", TOOLS).calls[0].arguments == {"code": "x"}
  assert tools.parse_action("<submit></submit>", TOOLS).calls == (tools.ToolCall("submit", {}),)


@pytest.mark.parametrize(
  "text, error",
  [
    ("<tool_call>{not json}</tool_call>", "not valid JSON"),
    ('<tool_call>["python"]</tool_call>', "must be an object"),
    ('<tool_call>{"name": "pyhton", "arguments": {}}</tool_call>', "unknown tool 'pyhton'"),
    (
      '<tool_call>{"name": "python", "arguments": {}}</tool_call>',
      "missing required argument(s) code",
    ),
    (
      '<tool_call>{"name": "python", "arguments": {"code": "1", "x": 2}}</tool_call>',
      "unknown argument(s) x",
    ),
    ('<tool_call>{"name": "python", "arguments": 5}</tool_call>', "must be a JSON object, got int"),
    ("oops </tool_call>", "without a matching <tool_call>"),
  ],
)
def test_malformed_calls_are_reported(text, error):
  p = tools.parse_action(text, TOOLS)
  assert p.calls == () and len(p.errors) == 1 and error in p.errors[0], p.errors


def test_render_round_trips():
  call = tools.ToolCall("python", {"code": "print('a\\nb')"})
  for fmt in tools.FORMATS:
    assert tools.parse_action(tools.render_call(call, TOOLS, fmt), TOOLS).calls == (call,)
  assert tools.render_call(call, TOOLS, "compact") == "<py>print('a\\nb')</py>"
  assert "<tools>" in tools.tools_prompt(TOOLS, "qwen3")
  assert tools.tools_prompt(TOOLS, "compact") == (
    "Tools:\n<py>code</py> run code\n<submit></submit> finish"
  )
  with pytest.raises(ValueError, match="tool_format"):
    tools.tools_prompt(TOOLS, "xml")


def test_truncate_middle_and_format_result():
  text = "".join(str(i % 10) for i in range(1000))
  out = base.truncate_middle(text, 100)
  assert len(out) <= 100 and out.startswith(text[:40]) and out.endswith(text[-20:])
  assert "[... 900 characters truncated ...]" in out
  assert base.truncate_middle("short", 100) == "short"
  r = sandbox.SandboxResult("1\n", "boom\n", 1, False, False, 0.0, "bwrap")
  assert base.format_result(r, timeout_s=5) == "1\nboom"
  r = sandbox.SandboxResult("", "", -9, True, True, 5.0, "bwrap")
  assert base.format_result(r, timeout_s=5) == "[output truncated]\n[timed out after 5 s]"
  assert base.format_result(sandbox.SandboxResult("", "", 0, False, False, 0, ""), timeout_s=1) == (
    "[no output]"
  )


class _EchoEnv(base.ToolEnv):
  tools = TOOLS
  submit_tool = "submit"

  def system_prompt(self):
    return "sys"

  def user_prompt(self, task):
    return task["q"]

  def execute(self, call):
    return "ran " + call.arguments["code"]

  def final_reward(self, text):
    return float(text == "42"), {}

  def submit_reward(self, call):
    return 0.5, {"submitted": True}


def test_tool_env_loop():
  env = _EchoEnv(max_turns=3, tool_format="compact")
  assert env.reset({"q": "hi"}) == [
    dict(role="system", content="sys"),
    dict(role="user", content="hi"),
  ]
  r = env.step("<py>a</py><tool_call>{bad}</tool_call>")
  assert not r.done and r.observation.startswith("Error: <tool_call> body is not valid JSON")
  assert r.observation.endswith("\n\nran a")
  assert (r.info["tool_calls"], r.info["format_errors"], r.info["turns"]) == (1, 1, 1)
  r = env.step("42")
  assert (r.done, r.reward, r.observation, r.info["finish_reason"]) == (True, 1.0, None, "answer")
  env.reset({"q": "x"})
  r = env.step("<submit></submit>")
  assert (r.done, r.reward, r.info["finish_reason"], r.info["submitted"]) == (
    True,
    0.5,
    "submit",
    True,
  )
  env.reset({"q": "x"})
  for _ in range(2):
    assert not env.step("<py>b</py>").done
  r = env.step("<py>b</py>")
  assert (r.done, r.reward, r.info["finish_reason"], r.info["turns"]) == (True, 0.0, "max_turns", 3)
