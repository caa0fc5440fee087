"""Tests for sao_jax.models: configs, the decoder, policy/critic alignment, MoE dispatch, KV cache."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from flax import nnx

from sao_jax import models
from sao_jax.models import memory, moe

# Jitted entry points shared by the tests (one compile per model structure and shape; eager
# op-by-op execution compiles every op separately and is far slower on CPU).
_logits = jax.jit(lambda m, t: m.logits(t))
_logprobs = jax.jit(
  lambda m, t, seg, temp: m.token_logprobs(t, segment_ids_bt=seg, temperature=temp)
)
_values = jax.jit(lambda c, t, seg: c.values(t, segment_ids_bt=seg))
_prefill = jax.jit(models.prefill, donate_argnums=1)
_extend = jax.jit(models.extend, donate_argnums=1)
_decode = jax.jit(models.decode_step, donate_argnums=1)


def _tokens(cfg, b=2, t=12, seed=1):
  return jax.random.randint(jax.random.key(seed), (b, t), 0, cfg.vocab_size)


@jax.jit
def _ref_logprobs(logits_btv, tokens_bt, temperature=1.0):
  """log p(tokens[t] | tokens[:t]) read from logits[t - 1], with 0 at t = 0."""
  logp = jax.nn.log_softmax(logits_btv / temperature, axis=-1)
  lp = jnp.take_along_axis(logp[:, :-1], tokens_bt[:, 1:, None], axis=-1)[..., 0]
  ent = -jnp.sum(jnp.exp(logp) * logp, axis=-1)[:, :-1]
  return jnp.pad(lp, ((0, 0), (1, 0))), jnp.pad(ent, ((0, 0), (1, 0)))


_POLICIES = {}


def _policy(name):
  if name not in _POLICIES:
    _POLICIES[name] = models.Policy(models.get_preset(name), rngs=nnx.Rngs(0))
  return _POLICIES[name]


@pytest.fixture(scope="module", params=["tiny", "tiny_moe"])
def policy(request):
  return _policy(request.param)


@pytest.fixture(scope="module")
def dense():
  return _policy("tiny")


# ---------------------------------------------------------------------- configs
def test_presets_and_config_from():
  assert set(models.PRESETS) >= {"tiny", "smollm2_135m", "qwen3_0_6b", "qwen3_8b", "qwen3_30b_a3b"}
  tiny = models.get_preset("tiny")
  assert tiny.num_layers == 2 and tiny.d_model == 64 and tiny.vocab_size >= 265
  section = ml_collections.ConfigDict(
    dict(
      preset="tiny",
      path="",
      tokenizer="byte",
      num_layers=3,
      dtype="bfloat16",
      param_dtype="float32",
      remat=True,
      logprob_block_size=128,
    )
  )
  cfg = models.config_from(section)
  assert (cfg.num_layers, cfg.dtype, cfg.remat, cfg.logprob_block_size) == (
    3,
    "bfloat16",
    True,
    128,
  )
  assert cfg.d_model == tiny.d_model
  q = models.get_preset("qwen3_30b_a3b")
  assert (q.num_layers, q.d_model, q.num_heads, q.num_kv_heads, q.head_dim) == (
    48,
    2048,
    32,
    4,
    128,
  )
  assert (q.num_experts, q.experts_per_token, q.moe_mlp_dim, q.vocab_size) == (128, 8, 768, 151936)


def test_config_errors_name_the_field():
  with pytest.raises(ValueError, match="model.preset"):
    models.get_preset("gpt5")
  with pytest.raises(ValueError, match="ModelConfig.num_heads"):
    models.get_preset("tiny").replace(num_heads=3)
  with pytest.raises(ValueError, match="ModelConfig.dtype"):
    models.get_preset("tiny").replace(dtype="float16")


def test_qwen3_30b_a3b_param_count():
  total, active = memory.count_params(models.get_preset("qwen3_30b_a3b"))
  assert 30.3e9 < total < 30.7e9
  assert 3.2e9 < active < 3.45e9
  # Hand count of the dense Qwen3-8B: embed + head + 36 * (attn + mlp + 2 norms + 2 qk norms) + norm.
  total8, active8 = memory.count_params(models.get_preset("qwen3_8b"))
  attn = 4096 * 128 * (32 + 8 + 8) + 32 * 128 * 4096
  layer = attn + 3 * 4096 * 12288 + 2 * 4096 + 2 * 128
  assert total8 == active8 == 2 * 151936 * 4096 + 36 * layer + 4096


def test_training_memory_table():
  cfg = models.get_preset("tiny")
  mem = memory.training_memory(cfg, {"data": 1}, with_critic=True)
  n_policy = sum(int(np.prod(v.shape)) for v in jax.tree.leaves(memory.abstract_state(cfg)))
  assert mem["policy/params"] == 4 * n_policy and mem["policy/adam"] == 8 * n_policy
  frozen = 2 * (64 * 16 * (4 + 2 + 2) + 4 * 16 * 64 + 2 * 16)  # q/k/v/o + q/k norms, 2 layers
  assert mem["critic/grads"] == mem["critic/params"] - 4 * frozen
  assert memory.parse_mesh("data=8,fsdp=8") == {"data": 8, "fsdp": 8}
  with pytest.raises(ValueError, match="--mesh"):
    memory.parse_mesh("pipeline=2")


# ---------------------------------------------------------------------- policy and critic
def test_token_logprobs_match_log_softmax(policy):
  tokens = _tokens(policy.cfg)
  logits = _logits(policy, tokens)
  assert logits.dtype == jnp.float32 and logits.shape == (2, 12, policy.cfg.vocab_size)
  for temperature in (1.0, 0.7):
    lp, ent = _logprobs(policy, tokens, None, temperature)
    ref_lp, ref_ent = _ref_logprobs(logits, tokens, temperature)
    np.testing.assert_allclose(lp, ref_lp, atol=2e-5)
    np.testing.assert_allclose(ent, ref_ent, atol=2e-5)
    assert float(jnp.abs(lp[:, 0]).max()) == 0.0


def test_packed_segments_equal_separate_rows(dense):
  policy = dense
  # Row 0 packs a (7 tokens) and b (5 tokens); row 1 holds a and row 2 b, right-padded.
  a, b = _tokens(policy.cfg, 1, 7, seed=2), _tokens(policy.cfg, 1, 5, seed=3)
  packed = jnp.concatenate([a, b], axis=1)
  seg = jnp.array([[1] * 7 + [2] * 5])
  lp_packed, _ = _logprobs(
    policy, jnp.concatenate([packed, packed]), jnp.concatenate([seg, seg]), 1.0
  )
  separate = jnp.concatenate([jnp.pad(a, ((0, 0), (0, 5))), jnp.pad(b, ((0, 0), (0, 7)))])
  lp_sep, _ = _logprobs(policy, separate, None, 1.0)
  np.testing.assert_allclose(
    lp_packed[0], jnp.concatenate([lp_sep[0, :7], lp_sep[1, :5]]), atol=2e-5
  )
  assert float(lp_packed[0, 7]) == 0.0  # first token of the second segment
  np.testing.assert_array_equal(
    models.default_positions(packed, seg)[0], [0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4]
  )


def test_right_padding_does_not_change_real_tokens(dense):
  policy = dense
  tokens = _tokens(policy.cfg, 2, 12, seed=4)
  padded = tokens.at[:, 7:].set(0)
  lp, _ = _logprobs(policy, tokens, None, 1.0)
  lp_pad, _ = _logprobs(policy, padded, None, 1.0)
  np.testing.assert_allclose(lp_pad[:, :7], lp[:, :7], atol=2e-5)


def test_critic_values_shift_and_copy(dense):
  policy = dense
  critic = models.critic_from_policy(policy, rngs=nnx.Rngs(7), head_init_std=0.5)
  tokens = _tokens(policy.cfg)
  h = jax.jit(lambda c, t: c.model(t)[0])(critic, tokens).astype(jnp.float32)
  head = jnp.einsum("btd,d->bt", h, critic.value_head[...]) + critic.value_bias[...]
  values = _values(critic, tokens, None)
  np.testing.assert_allclose(values[:, 1:], head[:, :-1], atol=1e-5)
  assert float(jnp.abs(values[:, 0]).max()) == 0.0
  seg = jnp.array([[1] * 5 + [2] * 7] * 2)
  assert float(jnp.abs(_values(critic, tokens, seg)[:, 5]).max()) == 0.0
  np.testing.assert_array_equal(critic.model.embed[...], policy.model.embed[...])
  assert critic.model.embed[...] is not policy.model.embed[...]
  d = policy.cfg.d_model
  assert abs(float(jnp.std(critic.value_head[...])) - 0.5 / d**0.5) < 0.3 * 0.5 / d**0.5


def test_critic_labels_freeze_exactly_attention():
  policy = _policy("tiny_moe")
  critic = models.Critic(policy.cfg, rngs=nnx.Rngs(1))
  state = nnx.state(critic, nnx.Param)
  labels = models.critic_param_labels(state)
  flat = {
    "/".join(str(getattr(k, "key", "")) for k in p): lab
    for p, lab in jax.tree_util.tree_flatten_with_path(labels)[0]
  }
  frozen = sorted(k.split("attn/")[1] for k, lab in flat.items() if lab == models.FROZEN)
  per_layer = ["k_norm/scale/", "k_proj/", "o_proj/", "q_norm/scale/", "q_proj/", "v_proj/"]
  assert frozen == sorted(per_layer * policy.cfg.num_layers)
  assert (
    flat["model/embed/"]
    == flat["value_head/"]
    == flat["model/layers/0/attn_norm/scale/"]
    == models.TRAINABLE
  )
  # optax.multi_transform leaves frozen leaves untouched.
  tx = optax.multi_transform(
    {models.TRAINABLE: optax.sgd(0.1), models.FROZEN: optax.set_to_zero()}, labels
  )
  grads = jax.tree.map(jnp.ones_like, state)
  updates, _ = tx.update(grads, tx.init(state), state)
  layer0 = updates["model"]["layers"][0]
  assert float(jnp.abs(layer0["attn"]["q_proj"][...]).max()) == 0.0
  assert float(jnp.abs(layer0["mlp"]["down_proj"][...]).min()) == pytest.approx(0.1)


def test_bf16_close_to_fp32():
  cfg = models.get_preset("tiny")
  p32 = models.Policy(cfg, rngs=nnx.Rngs(0))
  p16 = models.Policy(cfg.replace(dtype="bfloat16", param_dtype="bfloat16"), rngs=nnx.Rngs(0))
  tokens = _tokens(cfg)
  l16 = _logits(p16, tokens)
  assert l16.dtype == jnp.float32 and p16.model.embed[...].dtype == jnp.bfloat16
  np.testing.assert_allclose(l16, _logits(p32, tokens), atol=3e-2)


def test_remat_gives_the_same_gradient():
  cfg = models.get_preset("tiny").replace(num_layers=1)
  tokens = _tokens(cfg)

  def grads(remat):
    p = models.Policy(cfg.replace(remat=remat), rngs=nnx.Rngs(0))
    loss = lambda m: jnp.sum(jnp.tanh(m.logits(tokens)))
    return jax.jit(nnx.grad(loss))(p)

  g0, g1 = grads(False), grads(True)
  for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1), strict=True):
    np.testing.assert_allclose(a, b, atol=1e-5)


# ---------------------------------------------------------------------- MoE
def test_routed_swiglu_matches_per_token_loop():
  rng = np.random.default_rng(0)
  n, d, e, f, k = 9, 6, 4, 5, 2
  x = rng.normal(size=(n, d)).astype(np.float32)
  experts = np.stack([rng.choice(e, k, replace=False) for _ in range(n)]).astype(np.int32)
  w = rng.uniform(size=(n, k)).astype(np.float32)
  gate, up = rng.normal(size=(2, e, d, f)).astype(np.float32)
  down = rng.normal(size=(e, f, d)).astype(np.float32)
  out = moe.routed_swiglu(jnp.array(x), jnp.array(experts), jnp.array(w), gate, up, down)
  silu = lambda z: z / (1 + np.exp(-z))
  ref = np.zeros_like(x)
  for i in range(n):
    for j in range(k):
      ex = experts[i, j]
      ref[i] += w[i, j] * (silu(x[i] @ gate[ex]) * (x[i] @ up[ex])) @ down[ex]
  np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


def test_load_balance_stats_by_hand():
  probs = jnp.array([[0.7, 0.2, 0.1], [0.6, 0.3, 0.1]], jnp.float32)
  experts = jnp.array([[0], [0]])
  stats = moe.load_balance_stats(probs, experts)
  # f = [1, 0, 0] (both tokens to expert 0), P = [0.65, 0.25, 0.1]: loss = 3 * 0.65.
  assert float(stats["moe/load_balance_loss"]) == pytest.approx(1.95)
  assert float(stats["moe/max_load"]) == pytest.approx(3.0)
  lp = _policy("tiny_moe")
  metrics = jax.jit(lambda m, t: m.hidden(t)[1])(lp, _tokens(lp.cfg))
  assert set(metrics) == {"moe/load_balance_loss", "moe/max_load"}
  assert 1.0 <= float(metrics["moe/load_balance_loss"]) < 4.0  # = k = 2 when balanced


# ---------------------------------------------------------------------- KV cache
def test_prefill_and_decode_equal_full_forward(policy):
  cfg = policy.cfg
  tokens = _tokens(cfg, 2, 12)
  full = _logits(policy, tokens)
  cache = models.init_cache(cfg, num_slots=3, max_len=16)
  prefill, step = _prefill, _decode
  bucket = jnp.pad(tokens[:, :5], ((0, 0), (0, 3)), constant_values=7)
  cache, logits = prefill(policy, cache, bucket, jnp.array([5, 4]), jnp.array([2, 0]))
  np.testing.assert_allclose(logits[0], full[0, 4], atol=1e-5)
  np.testing.assert_allclose(logits[1], full[1, 3], atol=1e-5)
  assert len(cache.k) == cfg.num_layers and cache.k[0].shape == (
    3,
    cfg.num_kv_heads,
    16,
    cfg.head_dim,
  )
  assert max(float(jnp.abs(k[1]).max()) for k in cache.k) == 0.0  # slot 1 untouched
  np.testing.assert_array_equal(cache.lengths, [4, 0, 5])
  pos = {2: 5, 0: 4}  # next position per slot (row 0 -> slot 2, row 1 -> slot 0)
  for _ in range(6):
    tk = jnp.zeros(3, jnp.int32).at[2].set(tokens[0, pos[2]]).at[0].set(tokens[1, pos[0]])
    cache, logits = step(policy, cache, tk, jnp.array([True, False, True]))
    np.testing.assert_allclose(logits[2], full[0, pos[2]], atol=1e-5)
    np.testing.assert_allclose(logits[0], full[1, pos[0]], atol=1e-5)
    pos = {s: p + 1 for s, p in pos.items()}
  np.testing.assert_array_equal(cache.lengths, [10, 0, 11])
  assert max(float(jnp.abs(v[1]).max()) for v in cache.v) == 0.0


def test_decode_window_reads_fewer_positions_with_the_same_numbers(dense):
  """Attending to the first `window` cache positions gives the same logits (keys past a slot's
  length have exactly zero weight) and the same cache; a window outside [1, M] is refused."""
  policy = dense
  cfg = policy.cfg
  tokens = _tokens(cfg, 2, 12, seed=3)
  full = _logits(policy, tokens)
  decode = jax.jit(models.decode_step, static_argnames="window")
  cache = models.init_cache(cfg, num_slots=2, max_len=32)
  cache, _ = _prefill(policy, cache, tokens[:, :6], jnp.array([6, 3]), jnp.array([0, 1]))
  active = jnp.array([True, True])
  for t in (6, 7):  # slot 0 holds t tokens, slot 1 t - 3: window 8 covers both after this step
    step = jnp.stack([tokens[0, t], tokens[1, t - 3]])
    whole_cache, whole = decode(policy, cache, step, active)
    cache, windowed = decode(policy, cache, step, active, window=8)
    np.testing.assert_array_equal(windowed, whole)
    np.testing.assert_allclose(windowed[0], full[0, t], atol=1e-5)
    for a, b in zip(cache.k + cache.v, whole_cache.k + whole_cache.v, strict=True):
      np.testing.assert_array_equal(a, b)
  with pytest.raises(ValueError, match="window"):
    models.decode_step(policy, cache, step, active, window=33)


def test_extend_appends_after_existing_content(dense):
  policy = dense
  cfg = policy.cfg
  tokens = _tokens(cfg, 2, 12, seed=5)
  full = _logits(policy, tokens)
  cache = models.init_cache(cfg, num_slots=3, max_len=16)
  bucket = jnp.pad(tokens[:1, :6], ((0, 0), (0, 2)))
  cache, _ = _prefill(policy, cache, bucket, jnp.array([6]), jnp.array([1]))
  chunk = jnp.pad(tokens[:1, 6:10], ((0, 0), (0, 4)))
  cache, logits = _extend(policy, cache, chunk, jnp.array([4]), jnp.array([1]))
  np.testing.assert_allclose(logits[0], full[0, 9], atol=1e-5)
  assert int(cache.lengths[1]) == 10
  # Functional (graphdef, state) form gives the same.
  tk = jnp.array([0, tokens[0, 10], 0])
  cache2, logits2 = jax.jit(models.decode_step)(
    nnx.split(policy), cache, tk, jnp.array([False, True, False])
  )
  np.testing.assert_allclose(logits2[1], full[0, 10], atol=1e-5)
  np.testing.assert_array_equal(cache2.lengths, [0, 11, 0])
