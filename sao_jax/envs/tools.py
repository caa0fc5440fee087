"""Tool-call syntax: parsing actions, rendering calls, and the tool section of system prompts.

Two formats (config `env.tool_format`):

* 'qwen3': `<tool_call>{"name": "python", "arguments": {"code": "print(1)"}}</tool_call>`, the
  form Qwen3's chat template teaches. Several calls in one action are allowed.
* 'compact': `<TAG>body</TAG>` for tools that take one string argument, e.g. `<py>print(1)</py>` for
  the Python tool or `<sh>ls</sh>` for a shell; `<submit></submit>` for argument-less tools. Short
  and regular, so a byte-level model of ~1M parameters learns it from a few hundred demonstrations.

Both forms are always accepted when parsing (the format only chooses prompts and demonstrations). A
closing tag may be missing at the very end of an action (engines often stop on it and drop it).
Malformed calls become readable error strings, never exceptions.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

FORMATS = ("qwen3", "compact")


@dataclasses.dataclass(frozen=True)
class Tool:
  """A tool the policy may call.

  Attributes:
    name: function name used in 'qwen3' calls.
    description: one line for the system prompt.
    parameters: {argument: {"type": "string", "description": ...}} (JSON-schema properties).
    required: names of the required arguments.
    compact_tag: tag of the compact form (`<py>...</py>`), or None if the tool has no compact form.
    compact_arg: the argument the compact body fills (None for argument-less tools).
  """

  name: str
  description: str
  parameters: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)
  required: tuple[str, ...] = ()
  compact_tag: str | None = None
  compact_arg: str | None = None

  def schema(self) -> dict[str, Any]:
    """The OpenAI/Qwen function schema of this tool."""
    params = {"type": "object", "properties": self.parameters, "required": list(self.required)}
    return {
      "type": "function",
      "function": dict(name=self.name, description=self.description, parameters=params),
    }


@dataclasses.dataclass(frozen=True)
class ToolCall:
  """One parsed call: the tool's name and its arguments."""

  name: str
  arguments: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class ParsedAction:
  """An action split into tool calls, call errors (malformed calls) and the remaining text."""

  calls: tuple[ToolCall, ...]
  errors: tuple[str, ...]
  text: str


_QWEN_RE = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)


def _check_call(name: Any, args: Any, tools: dict[str, Tool]) -> ToolCall | str:
  if not isinstance(name, str) or name not in tools:
    return f"unknown tool {name!r}; available tools: {', '.join(sorted(tools))}"
  if isinstance(args, str):  # some models emit the arguments as a JSON string
    try:
      args = json.loads(args) if args.strip() else {}
    except json.JSONDecodeError:
      return f"tool {name!r}: 'arguments' is a string that is not a JSON object"
  if not isinstance(args, dict):
    return f"tool {name!r}: 'arguments' must be a JSON object, got {type(args).__name__}"
  tool = tools[name]
  missing = [a for a in tool.required if a not in args]
  if missing:
    return f"tool {name!r}: missing required argument(s) {', '.join(missing)}"
  unknown = [a for a in args if a not in tool.parameters]
  if unknown:
    return f"tool {name!r}: unknown argument(s) {', '.join(unknown)}"
  return ToolCall(name, args)


def _parse_qwen3(body: str, tools: dict[str, Tool]) -> ToolCall | str:
  try:
    obj = json.loads(body.strip())
  except json.JSONDecodeError as e:
    return f"<tool_call> body is not valid JSON ({e.msg} at char {e.pos})"
  if not isinstance(obj, dict) or "name" not in obj:
    return 'the <tool_call> JSON must be an object {"name": ..., "arguments": {...}}'
  return _check_call(obj["name"], obj.get("arguments", {}), tools)


def _compact_re(tools: dict[str, Tool]) -> re.Pattern | None:
  tags = sorted({re.escape(t.compact_tag) for t in tools.values() if t.compact_tag})
  if not tags:
    return None
  alt = "|".join(tags)
  return re.compile(rf"<({alt})>(.*?)(?:</\1>|\Z)", re.DOTALL)


def parse_action(text: str, tools: list[Tool]) -> ParsedAction:
  """Finds the tool calls in an action, in order of appearance.

  Args:
    text: the policy's action text for one turn.
    tools: the environment's tools.

  Returns:
    ParsedAction(calls, errors, text without the calls). An error names what was wrong, e.g. 'the
    <tool_call> body is not valid JSON' or "unknown tool 'pyhton'".
  """
  by_name = {t.name: t for t in tools}
  by_tag = {t.compact_tag: t for t in tools if t.compact_tag}
  found: list[tuple[int, ToolCall | str]] = []
  spans = []
  for m in _QWEN_RE.finditer(text):
    found.append((m.start(), _parse_qwen3(m.group(1), by_name)))
    spans.append(m.span())
  pattern = _compact_re(by_name)
  if pattern is not None:
    for m in pattern.finditer(text):
      if any(a <= m.start() < b for a, b in spans):
        continue  # compact-looking text inside a qwen3 call's JSON
      tool = by_tag[m.group(1)]
      args = {tool.compact_arg: m.group(2)} if tool.compact_arg else {}
      found.append((m.start(), ToolCall(tool.name, args)))
      spans.append(m.span())
  found.sort(key=lambda x: x[0])
  rest, last = [], 0
  for a, b in sorted(spans):
    rest.append(text[last:a])
    last = b
  rest.append(text[last:])
  calls = tuple(c for _, c in found if isinstance(c, ToolCall))
  errors = tuple(c for _, c in found if isinstance(c, str))
  if "</tool_call>" in "".join(rest):
    errors += ("found </tool_call> without a matching <tool_call>",)
  return ParsedAction(calls, errors, "".join(rest))


def render_call(call: ToolCall, tools: list[Tool], tool_format: str) -> str:
  """The text of one tool call in `tool_format` (falls back to qwen3 without a compact form)."""
  tool = {t.name: t for t in tools}[call.name]
  if tool_format == "compact" and tool.compact_tag:
    body = call.arguments.get(tool.compact_arg, "") if tool.compact_arg else ""
    return f"<{tool.compact_tag}>{body}</{tool.compact_tag}>"
  payload = json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)
  return f"<tool_call>\n{payload}\n</tool_call>"


def tools_prompt(tools: list[Tool], tool_format: str) -> str:
  """The system-prompt section that explains the tools and their call syntax."""
  if tool_format not in FORMATS:
    raise ValueError(f"tool_format: must be one of {FORMATS}, got {tool_format!r}")
  if tool_format == "compact" and all(t.compact_tag for t in tools):
    lines = []
    for t in tools:
      body = f"{t.compact_arg}" if t.compact_arg else ""
      lines.append(f"<{t.compact_tag}>{body}</{t.compact_tag}> {t.description}")
    return "Tools:\n" + "\n".join(lines)
  schemas = "\n".join(json.dumps(t.schema(), ensure_ascii=False) for t in tools)
  return (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n"
    f"<tools>\n{schemas}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
  )
