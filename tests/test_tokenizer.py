"""Tests for sao_jax.models.tokenizer: byte and BPE tokenizers, Qwen3 chat rendering, and the
token-in/token-out identity prefix + assistant + observation == render(whole conversation)."""

import json

import pytest

from sao_jax import models
from sao_jax.models import tokenizer as tk

TOOLS = [
  {
    "type": "function",
    "function": {"name": "python", "description": "Run code", "parameters": {"type": "object"}},
  }
]
CALL = {"function": {"name": "python", "arguments": {"code": "print(6 * 7)"}}}


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
  """A byte-level BPE trained in-process (HF tokenizers) with ChatML/Qwen3 added tokens."""
  from tokenizers import Tokenizer, decoders, pre_tokenizers, trainers
  from tokenizers import models as tok_models

  tok = Tokenizer(tok_models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
    vocab_size=400,
    special_tokens=list(tk.BYTE_SPECIALS[:3]),
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
  )
  corpus = [
    "The answer is 42. Let me call a tool to check the arithmetic.",
    "def f(x):\n    return x * 2\n",
    "user assistant system tool_response",
  ] * 50
  tok.train_from_iterator(corpus, trainer)
  tok.add_tokens(list(tk.BYTE_SPECIALS[3:]))
  path = tmp_path_factory.mktemp("bpe")
  tok.save(str(path / "tokenizer.json"))
  with open(path / "tokenizer_config.json", "w") as f:
    json.dump({"chat_template": "{{ messages }}"}, f)
  return models.load_tokenizer(str(path))


def test_byte_tokenizer():
  tok = models.load_tokenizer("byte")
  assert tok.vocab_size == 272 <= models.get_preset("tiny").vocab_size
  ids = tok.encode("héllo<|im_end|>\n")
  assert ids == [104, 195, 169, 108, 108, 111, 258, 10]
  assert tok.decode(ids) == "héllo<|im_end|>\n"
  assert tok.decode(ids, skip_special=True) == "héllo\n"
  assert tok.encode("<|im_end|>", allow_special=False) == list(b"<|im_end|>")
  assert (tok.eos_id, tok.pad_id, tok.im_start_id, tok.stop_ids) == (258, 256, 257, (258, 256))


def test_render_chat_qwen3_format():
  tok = models.load_tokenizer("byte")
  messages = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 6*7?"},
    {"role": "assistant", "content": "Let me compute.", "tool_calls": [CALL]},
    {"role": "tool", "content": "42"},
    {"role": "tool", "content": "ok"},
    {"role": "assistant", "content": "<think>\nsimple\n</think>\n\n42"},
  ]
  text = tok.render_chat_text(messages, tools=TOOLS)
  expected = (
    "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions to assist "
    "with the user query.\n\nYou are provided with function signatures within <tools></tools> "
    "XML tags:\n<tools>\n" + json.dumps(TOOLS[0]) + "\n</tools>\n\nFor each function call, "
    "return a json object with function name and arguments within <tool_call></tool_call> XML "
    'tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call><|im_end|>\n"
    "<|im_start|>user\nWhat is 6*7?<|im_end|>\n"
    '<|im_start|>assistant\nLet me compute.\n<tool_call>\n{"name": "python", "arguments": '
    '{"code": "print(6 * 7)"}}\n</tool_call><|im_end|>\n'
    "<|im_start|>user\n<tool_response>\n42\n</tool_response>\n<tool_response>\nok\n"
    "</tool_response><|im_end|>\n"
    "<|im_start|>assistant\n<think>\nsimple\n</think>\n\n42<|im_end|>\n"
  )
  assert text == expected
  # Reasoning of turns before the last user query is dropped; enable_thinking=False adds an empty
  # think block to the generation prompt.
  later = [*messages, {"role": "user", "content": "Thanks"}]
  text = tok.render_chat_text(later, add_generation_prompt=True, enable_thinking=False)
  assert "simple" not in text and "<|im_start|>assistant\n42<|im_end|>" in text
  assert text.endswith(
    "<|im_start|>user\nThanks<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
  )
  assert tok.render_chat(later) == tok.encode(tok.render_chat_text(later))
  with pytest.raises(ValueError, match=r"messages\[0\]\.role"):
    tok.render_chat([{"role": "robot", "content": "x"}])


def _token_in_token_out(tok):
  history = [
    {"role": "system", "content": "Use tools."},
    {"role": "user", "content": "What is 6*7? Check it."},
  ]
  prompt = tok.render_chat(history, add_generation_prompt=True, tools=TOOLS)
  # What the engine generated (its own ids, ending with <|im_end|>) ...
  generated = (
    'I will check.\n<tool_call>\n{"name": "python", "arguments": '
    '{"code": "print(6 * 7)"}}\n</tool_call>'
  )
  assistant_ids = [*tok.encode(generated), tok.eos_id]
  # ... then the observation framing for two tool results.
  obs_ids = tok.tool_observation_ids(["42", "done"])
  whole = [
    *history,
    {"role": "assistant", "content": "I will check.", "tool_calls": [CALL]},
    {"role": "tool", "content": "42"},
    {"role": "tool", "content": "done"},
  ]
  assert prompt + assistant_ids + obs_ids == tok.render_chat(
    whole, add_generation_prompt=True, tools=TOOLS
  )
  # Same with the tool call left as raw text in the content, and a plain user follow-up.
  raw = [
    *history,
    {"role": "assistant", "content": generated},
    {"role": "tool", "content": "42"},
    {"role": "tool", "content": "done"},
  ]
  assert prompt + assistant_ids + obs_ids == tok.render_chat(
    raw, add_generation_prompt=True, tools=TOOLS
  )
  follow = tok.user_turn_ids("Now 7*8?", close_turn=True)
  plain = [
    *history,
    {"role": "assistant", "content": "42"},
    {"role": "user", "content": "Now 7*8?"},
  ]
  assert prompt + tok.encode("42") + follow == tok.render_chat(
    plain, add_generation_prompt=True, tools=TOOLS
  )


def test_token_in_token_out_byte():
  _token_in_token_out(models.load_tokenizer("byte"))


def test_token_in_token_out_bpe(bpe):
  assert bpe.im_end_id == 2 and bpe.specials["<tool_call>"] >= 3
  text = "The answer is 42.<|im_end|>"
  ids = bpe.encode(text)
  assert ids[-1] == bpe.im_end_id and len(ids) < len(text) - 10  # merges were learned
  assert bpe.decode(ids) == text
  plain = bpe.encode(text, allow_special=False)
  assert bpe.im_end_id not in plain and bpe.decode(plain) == text
  assert bpe.encode(text) == ids  # the shared tokenizer is unchanged
  _token_in_token_out(bpe)


def test_default_system_prompt_from_template():
  smol = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are SmolLM.<|im_end|>\n' }}{% endif %}{% endfor %}"
  )
  assert tk.default_system_of(smol) == "You are SmolLM."
  assert tk.default_system_of("{{ messages }}") is None
  text = tk.render_chat_text([{"role": "user", "content": "hi"}], default_system="Sys")
  assert text == "<|im_start|>system\nSys<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"


def test_load_tokenizer_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match="tokenizer.json"):
    models.load_tokenizer(str(tmp_path))
