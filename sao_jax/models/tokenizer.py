"""Tokenizers and ChatML / Qwen3 chat rendering to token ids, built for token-in/token-out rollouts.

`load_tokenizer(spec)` gives a `Tokenizer`:
  - "byte": an in-process byte tokenizer (ids 0-255 are bytes, then ChatML/Qwen3 specials; vocab
    272) for the tiny model, tests and the CPU quickstart;
  - a Hugging Face `tokenizer.json` file or a directory holding one (plus tokenizer_config.json);
  - a `.gguf` file: the byte-level BPE stored in its metadata (SmolLM2), with llama.cpp's
    pre-tokenizer (for 'smollm': every digit is its own token).

`render_chat(messages, add_generation_prompt=..., tools=...)` follows the Qwen3 chat template
(system prompt with a `# Tools` section, `<tool_call>` JSON in assistant turns, consecutive tool
results grouped into one user turn in `<tool_response>` blocks, `<think>` reasoning kept after
the last user query). Multi-turn rollouts never re-tokenize a conversation: the agent appends the
engine's own output ids and then `tool_observation_ids(results)`, the exact ids between the
assistant's `<|im_end|>` and the next generation, so that

  render_chat(history, add_generation_prompt=True) + assistant_ids + tool_observation_ids(results)
    == render_chat(history + [assistant, *tool messages], add_generation_prompt=True).
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Mapping, Sequence
from typing import Any

ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
BYTE_SPECIALS = (
  ENDOFTEXT,
  IM_START,
  IM_END,
  "<tool_call>",
  "</tool_call>",
  "<tool_response>",
  "</tool_response>",
  "<think>",
  "</think>",
)
BYTE_VOCAB_SIZE = 272  # 256 bytes + 9 specials, padded to a multiple of 16

_TOOLS_HEADER = (
  "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
  "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_TOOLS_FOOTER = (
  "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
  'within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, '
  '"arguments": <args-json-object>}\n</tool_call>'
)

Message = Mapping[str, Any]


class Tokenizer:
  """Text <-> ids plus chat rendering. Subclasses implement `encode`, `decode` and `vocab_size`.

  Attributes:
    specials: added tokens matched whole in text (e.g. '<|im_end|>') -> id.
    default_system: system prompt inserted when a conversation has none (SmolLM2's template), or
      None.
  """

  specials: dict[str, int]
  default_system: str | None = None

  @property
  def vocab_size(self) -> int:
    raise NotImplementedError

  def encode(self, text: str, *, allow_special: bool = True) -> list[int]:
    """Token ids of `text`; special-token strings become their ids unless allow_special=False."""
    raise NotImplementedError

  def decode(self, ids: Sequence[int], *, skip_special: bool = False) -> str:
    """Text of `ids` (invalid UTF-8 is replaced)."""
    raise NotImplementedError

  # ------------------------------------------------------------------ special ids
  def _id(self, token: str) -> int | None:
    return self.specials.get(token)

  @property
  def im_start_id(self) -> int | None:
    return self._id(IM_START)

  @property
  def im_end_id(self) -> int | None:
    return self._id(IM_END)

  @property
  def endoftext_id(self) -> int | None:
    return self._id(ENDOFTEXT)

  @property
  def eos_id(self) -> int:
    """The id that ends an assistant turn (<|im_end|> for ChatML models)."""
    eos = self.im_end_id if self.im_end_id is not None else self.endoftext_id
    if eos is None:
      raise ValueError("tokenizer has neither <|im_end|> nor <|endoftext|>")
    return eos

  @property
  def pad_id(self) -> int:
    return self.endoftext_id if self.endoftext_id is not None else self.eos_id

  @property
  def stop_ids(self) -> tuple[int, ...]:
    """Ids that end generation: <|im_end|> and <|endoftext|> (where present)."""
    return tuple(i for i in (self.im_end_id, self.endoftext_id) if i is not None)

  # ------------------------------------------------------------------ chat
  def render_chat_text(
    self,
    messages: Sequence[Message],
    *,
    add_generation_prompt: bool = False,
    tools: Sequence[Mapping[str, Any]] | None = None,
    enable_thinking: bool | None = None,
  ) -> str:
    """The conversation as text, following the Qwen3 chat template (see module docstring)."""
    return render_chat_text(
      messages,
      add_generation_prompt=add_generation_prompt,
      tools=tools,
      enable_thinking=enable_thinking,
      default_system=self.default_system,
    )

  def render_chat(
    self,
    messages: Sequence[Message],
    *,
    add_generation_prompt: bool = False,
    tools: Sequence[Mapping[str, Any]] | None = None,
    enable_thinking: bool | None = None,
  ) -> list[int]:
    """Token ids of `render_chat_text(...)`.

    Args:
      messages: dicts with 'role' (system | user | assistant | tool) and 'content'; assistant
        messages may carry 'tool_calls' ([{'function': {'name', 'arguments'}}] or [{'name',
        'arguments'}]) and 'reasoning_content'.
      add_generation_prompt: end with '<|im_start|>assistant\\n'.
      tools: JSON-schema tool descriptions for the system prompt.
      enable_thinking: False appends an empty <think></think> block to the generation prompt.

    Returns:
      list of token ids.
    """
    return self.encode(
      self.render_chat_text(
        messages,
        add_generation_prompt=add_generation_prompt,
        tools=tools,
        enable_thinking=enable_thinking,
      )
    )

  def generation_prompt_ids(self, *, enable_thinking: bool | None = None) -> list[int]:
    """Ids of '<|im_start|>assistant\\n' (plus an empty think block if enable_thinking=False)."""
    return self.encode(_generation_prompt(enable_thinking))

  def tool_observation_ids(
    self,
    results: str | Sequence[str],
    *,
    add_generation_prompt: bool = True,
    enable_thinking: bool | None = None,
    close_turn: bool = False,
  ) -> list[int]:
    """Ids between an assistant turn's <|im_end|> and the next assistant generation.

    Args:
      results: one tool result, or several (one per tool call, grouped in one user turn).
      add_generation_prompt: end with the assistant generation prompt.
      enable_thinking: as in render_chat.
      close_turn: prepend <|im_end|> (use when generation stopped without emitting it, e.g. at
        the token limit).

    Returns:
      '\\n<|im_start|>user\\n<tool_response>\\n...\\n</tool_response><|im_end|>\\n' [+ prompt], as ids.
    """
    results = [results] if isinstance(results, str) else list(results)
    text = (
      "\n"
      + IM_START
      + "user"
      + "".join(f"\n<tool_response>\n{r}\n</tool_response>" for r in results)
      + IM_END
      + "\n"
    )
    return self._observation(text, add_generation_prompt, enable_thinking, close_turn)

  def user_turn_ids(
    self,
    content: str,
    *,
    add_generation_prompt: bool = True,
    enable_thinking: bool | None = None,
    close_turn: bool = False,
  ) -> list[int]:
    """Like tool_observation_ids for a plain user message (a follow-up question or feedback)."""
    text = f"\n{IM_START}user\n{content}{IM_END}\n"
    return self._observation(text, add_generation_prompt, enable_thinking, close_turn)

  def _observation(self, text, add_generation_prompt, enable_thinking, close_turn):
    if add_generation_prompt:
      text += _generation_prompt(enable_thinking)
    return ([self.eos_id] if close_turn else []) + self.encode(text)


class ByteTokenizer(Tokenizer):
  """Bytes 0-255 are ids 0-255; ChatML/Qwen3 specials follow (256 = <|endoftext|>, ...)."""

  def __init__(self):
    self.specials = {s: 256 + i for i, s in enumerate(BYTE_SPECIALS)}
    self._special_re = re.compile("(" + "|".join(re.escape(s) for s in BYTE_SPECIALS) + ")")
    self._names = {i: s for s, i in self.specials.items()}

  @property
  def vocab_size(self) -> int:
    return BYTE_VOCAB_SIZE

  def encode(self, text: str, *, allow_special: bool = True) -> list[int]:
    if not allow_special:
      return list(text.encode("utf-8"))
    ids: list[int] = []
    for i, piece in enumerate(self._special_re.split(text)):
      ids.extend([self.specials[piece]] if i % 2 else piece.encode("utf-8"))
    return ids

  def decode(self, ids: Sequence[int], *, skip_special: bool = False) -> str:
    out, buf = [], bytearray()
    for i in ids:
      i = int(i)
      if i < 256:
        buf.append(i)
        continue
      out.append(buf.decode("utf-8", errors="replace"))
      buf = bytearray()
      if not skip_special:
        out.append(self._names.get(i, ""))
    out.append(buf.decode("utf-8", errors="replace"))
    return "".join(out)


class HFTokenizer(Tokenizer):
  """A `tokenizers.Tokenizer` (Hugging Face tokenizer.json, or built from GGUF metadata)."""

  def __init__(
    self, tok: Any, *, default_system: str | None = None, chat_template: str | None = None
  ):
    self._tok = tok
    self._plain_tok, self._lock = None, threading.Lock()
    self.specials = {t.content: i for i, t in tok.get_added_tokens_decoder().items()}
    self.default_system = default_system
    self.chat_template = chat_template

  @property
  def vocab_size(self) -> int:
    return self._tok.get_vocab_size(with_added_tokens=True)

  def encode(self, text: str, *, allow_special: bool = True) -> list[int]:
    tok = self._tok if allow_special else self._plain()
    return list(tok.encode(text, add_special_tokens=False).ids)

  def _plain(self):
    """A copy that encodes special-token strings as text (a copy, not a flag flipped on the shared
    tokenizer, so that concurrent rollout threads never see each other's mode)."""
    with self._lock:
      if self._plain_tok is None:
        self._plain_tok = type(self._tok).from_str(self._tok.to_str())
        self._plain_tok.encode_special_tokens = True
      return self._plain_tok

  def decode(self, ids: Sequence[int], *, skip_special: bool = False) -> str:
    return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special)

  def save(self, path: str):
    """Writes tokenizer.json and a minimal tokenizer_config.json into directory `path`."""
    os.makedirs(path, exist_ok=True)
    self._tok.save(os.path.join(path, "tokenizer.json"))
    conf = {
      "tokenizer_class": "PreTrainedTokenizerFast",
      "eos_token": IM_END if self.im_end_id is not None else ENDOFTEXT,
      "pad_token": ENDOFTEXT,
    }
    if self.chat_template:
      conf["chat_template"] = self.chat_template
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
      json.dump(conf, f, indent=2)


def load_tokenizer(spec: str) -> Tokenizer:
  """'byte', a tokenizer.json, a directory holding one, or a .gguf file -> Tokenizer."""
  from tokenizers import Tokenizer as HFTok

  if spec == "byte":
    return ByteTokenizer()
  if spec.endswith(".gguf"):
    from sao_jax.models.gguf import tokenizer_from_gguf

    return tokenizer_from_gguf(spec)
  path = os.path.join(spec, "tokenizer.json") if os.path.isdir(spec) else spec
  if not os.path.isfile(path):
    raise FileNotFoundError(
      f"load_tokenizer: {spec!r} is not 'byte', a .gguf, a tokenizer.json "
      "or a directory holding tokenizer.json"
    )
  template = None
  conf_path = os.path.join(os.path.dirname(path), "tokenizer_config.json")
  if os.path.isfile(conf_path):
    with open(conf_path) as f:
      template = json.load(f).get("chat_template")
  return HFTokenizer(
    HFTok.from_file(path), default_system=default_system_of(template), chat_template=template
  )


def default_system_of(chat_template: str | None) -> str | None:
  """The system prompt a ChatML template inserts when there is none (SmolLM2's), else None."""
  if not chat_template or "!= 'system'" not in chat_template:
    return None
  m = re.search(r"<\|im_start\|>system\n(.*?)<\|im_end\|>", chat_template, re.S)
  return m.group(1) if m else None


# ---------------------------------------------------------------------- rendering (Qwen3 template)
def render_chat_text(
  messages: Sequence[Message],
  *,
  add_generation_prompt: bool = False,
  tools: Sequence[Mapping[str, Any]] | None = None,
  enable_thinking: bool | None = None,
  default_system: str | None = None,
) -> str:
  """The conversation as text, following the Qwen3 chat template (module docstring)."""
  messages = list(messages)
  _check_messages(messages)
  out = [_system_text(messages, tools, default_system)]
  last_query = _last_query_index(messages)
  for i, m in enumerate(messages):
    role = m["role"]
    if role == "user" or (role == "system" and i > 0):
      out.append(f"{IM_START}{role}\n{m['content']}{IM_END}\n")
    elif role == "assistant":
      out.append(_assistant_text(m, keep_reasoning=i > last_query, is_last=i == len(messages) - 1))
    elif role == "tool":
      if i == 0 or messages[i - 1]["role"] != "tool":
        out.append(IM_START + "user")
      out.append(f"\n<tool_response>\n{m['content']}\n</tool_response>")
      if i == len(messages) - 1 or messages[i + 1]["role"] != "tool":
        out.append(IM_END + "\n")
  if add_generation_prompt:
    out.append(_generation_prompt(enable_thinking))
  return "".join(out)


def _check_messages(messages):
  for i, m in enumerate(messages):
    if m.get("role") not in ("system", "user", "assistant", "tool"):
      raise ValueError(
        f"messages[{i}].role: must be system/user/assistant/tool, got {m.get('role')!r}"
      )
    if not isinstance(m.get("content", ""), str):
      raise ValueError(f"messages[{i}].content: must be a string")


def _system_text(messages, tools, default_system) -> str:
  first_system = bool(messages) and messages[0]["role"] == "system"
  if tools:
    head = messages[0]["content"] + "\n\n" if first_system else ""
    tool_lines = "".join("\n" + json.dumps(t, ensure_ascii=False) for t in tools)
    return f"{IM_START}system\n{head}{_TOOLS_HEADER}{tool_lines}{_TOOLS_FOOTER}{IM_END}\n"
  if first_system:
    return f"{IM_START}system\n{messages[0]['content']}{IM_END}\n"
  if default_system is not None:
    return f"{IM_START}system\n{default_system}{IM_END}\n"
  return ""


def _last_query_index(messages) -> int:
  """Index of the last user message that is not a bare tool response."""
  for i in range(len(messages) - 1, -1, -1):
    c = messages[i].get("content") or ""
    if messages[i]["role"] == "user" and not (
      c.startswith("<tool_response>") and c.endswith("</tool_response>")
    ):
      return i
  return len(messages) - 1


def _assistant_text(m: Message, *, keep_reasoning: bool, is_last: bool) -> str:
  content = m.get("content") or ""
  reasoning = m.get("reasoning_content")
  if reasoning is None:
    reasoning = ""
    if "</think>" in content:
      reasoning = content.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
      content = content.split("</think>")[-1].lstrip("\n")
  if keep_reasoning and (is_last or reasoning):
    text = f"{IM_START}assistant\n<think>\n{reasoning.strip(chr(10))}\n</think>\n\n"
    text += content.lstrip("\n")
  else:
    text = f"{IM_START}assistant\n{content}"
  for j, call in enumerate(m.get("tool_calls") or ()):
    call = call.get("function", call)
    args = call.get("arguments", {})
    args = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    text += "\n" if (j == 0 and content) or j > 0 else ""
    text += f'<tool_call>\n{{"name": "{call["name"]}", "arguments": {args}}}\n</tool_call>'
  return text + IM_END + "\n"


def _generation_prompt(enable_thinking: bool | None) -> str:
  text = IM_START + "assistant\n"
  return text + ("<think>\n\n</think>\n\n" if enable_thinking is False else "")
