"""The embedded engine on a tiny model: greedy parity with full forwards, log-prob parity with the
training path, batch-independent (deterministic) outputs, mid-generation weight swaps, continuous
batching, stop/length handling, sampled frequencies (chi-square), and no recompilation."""

import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sao_jax import models
from sao_jax.rollout import Engine, GenerateRequest

CFG = models.get_preset("tiny").replace(init_std=0.4)  # peaked next-token distributions
BUCKETS = (16, 64)
WINDOWS = (16, 32, 64)  # decode attends to 16, 32 or 64 cache positions, whichever holds all


@pytest.fixture(scope="module")
def policy():
  return models.Policy(CFG, rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def engine(policy):
  eng = Engine(policy, num_slots=4, max_len=64, prompt_buckets=BUCKETS, decode_windows=WINDOWS,
               prefill_batch=2, seed=3)  # fmt: skip
  eng.warmup()
  yield eng
  eng.close()


@jax.jit
def _logits(policy, tokens_bt):
  return policy.logits(tokens_bt)


@jax.jit
def _train_logprobs(policy, tokens_bt):
  return policy.token_logprobs(tokens_bt)[0]


def padded(ids, length=64):
  return jnp.asarray([list(ids) + [0] * (length - len(ids))], jnp.int32)


def next_logits(policy, prefix):
  """f32[V] next-token logits after `prefix` by a full forward (causal: padding is ignored)."""
  return _logits(policy, padded(prefix))[0, len(prefix) - 1]


def greedy_reference(policy, prompt, n):
  """n greedy tokens by full forwards over the whole sequence (no cache)."""
  ids = list(prompt)
  for _ in range(n):
    ids.append(int(jnp.argmax(next_logits(policy, ids))))
  return ids[len(prompt) :]


def prompt_of(n, offset=0):
  return [(7 * i + 3 * offset + 1) % 250 for i in range(n)]


def test_greedy_equals_a_plain_loop_over_full_forwards(engine, policy):
  prompts = [prompt_of(n, i) for i, n in enumerate((3, 9, 16, 17, 30, 5))]  # both buckets
  results = engine.generate(
    [GenerateRequest(p, max_new_tokens=10, temperature=0.0) for p in prompts]
  )  # 6 requests on 4 slots
  for p, r in zip(prompts, results, strict=True):
    assert r.output_ids == greedy_reference(policy, p, 10)
    assert r.finish_reason == "length" and r.prompt_len == len(p)
    assert r.versions == [0] * 10


def test_logprobs_equal_the_training_path(engine, policy):
  prompts = [prompt_of(n, i) for i, n in enumerate((4, 12, 20))]
  results = engine.generate(
    [GenerateRequest(p, max_new_tokens=24, seed=i) for i, p in enumerate(prompts)]
  )
  for p, r in zip(prompts, results, strict=True):
    train_lp = _train_logprobs(policy, padded(p + r.output_ids))[0]  # fused kernel, fp32
    n = len(r.output_ids)
    np.testing.assert_allclose(r.logprobs, train_lp[len(p) : len(p) + n], atol=1e-4, rtol=0)


def test_output_depends_only_on_the_request_not_on_the_batch(engine):
  probe = GenerateRequest(prompt_of(11), max_new_tokens=20, temperature=1.0, top_p=0.9, seed=42)
  alone = engine.generate([probe])[0]
  others = [
    GenerateRequest(prompt_of(n, n), max_new_tokens=m, temperature=t, top_k=k, seed=n)
    for n, m, t, k in ((5, 30, 1.0, 0), (20, 7, 0.0, 0), (2, 13, 0.7, 5), (14, 25, 1.2, 0))
  ]
  # Submitted behind others, it lands in another slot, next to other work, at another time.
  crowd = engine.generate([*others[:3], probe, others[3]])[3]
  assert crowd.output_ids == alone.output_ids
  assert crowd.logprobs == alone.logprobs  # bit-identical
  again = engine.generate([probe, *others])[0]
  assert again.output_ids == alone.output_ids and again.logprobs == alone.logprobs
  other_seed = engine.generate([GenerateRequest(probe.input_ids, 20, 1.0, 0.9, seed=43)])[0]
  assert other_seed.output_ids != alone.output_ids


def test_continuous_batching_refills_a_freed_slot_at_once(engine):
  engine.reset_stats()
  long = GenerateRequest(prompt_of(4), max_new_tokens=40, temperature=0.0)
  shorts = [GenerateRequest(prompt_of(4, i), max_new_tokens=3, seed=i) for i in range(9)]
  results = engine.generate([long, *shorts])
  stats = engine.stats()
  # Static batches of 4 would need 40 + 3 + 3 decode steps; refilled slots finish alongside.
  assert stats["decode_steps"] <= 40
  assert all(r.timings["total"] < results[0].timings["total"] for r in results[1:])
  assert stats["prefills"] == 10 and stats["tokens"] == 40 + 27


def test_weight_swap_mid_generation_versions_each_token(engine, policy):
  new_state = jax.tree.map(lambda x: x * 1.5, nnx.state(policy))
  new_policy = nnx.merge(nnx.graphdef(policy), new_state)
  request = GenerateRequest(prompt_of(6), max_new_tokens=50, temperature=0.0)
  engine.reset_stats()
  future = engine.submit(request)
  while engine.stats().get("tokens", 0) < 8:
    time.sleep(0.002)
  engine.update_weights(new_state, version=7)
  result = future.result()
  try:
    versions = np.asarray(result.versions)
    k = int(np.argmax(versions == 7))
    assert 8 <= k < 50 and set(versions[:k]) == {0} and set(versions[k:]) == {7}
    assert result.output_ids[:k] == greedy_reference(policy, request.input_ids, k)
    # From the swap on, tokens come from the new weights on top of the cache the old ones wrote
    # (in-flight sequences keep their keys/values, as SGLang's in-place update does).
    expected = mixed_greedy(policy, new_policy, request.input_ids, k, 50)
    assert result.output_ids == expected
    assert engine.version == 7
    assert engine.generate([GenerateRequest(prompt_of(3), 2, temperature=0.0)])[0].versions == [
      7,
      7,
    ]
  finally:
    engine.update_weights(policy, version=0)


def mixed_greedy(old, new, prompt, k, n):
  """Greedy decoding through the model's KV-cache functions, switching weights before token k."""
  cache = models.init_cache(CFG, 1, 64)
  cache, logits = _prefill(old, cache, padded(prompt), jnp.int32([len(prompt)]), jnp.int32([0]))
  out = [int(jnp.argmax(logits[0]))]
  while len(out) < n:
    cache, logits = _decode(old if len(out) < k else new, cache, jnp.int32(out[-1:]))
    out.append(int(jnp.argmax(logits[0])))
  return out


_prefill = jax.jit(models.prefill)
_decode = jax.jit(
  lambda policy, cache, tok: models.decode_step(policy, cache, tok, jnp.ones(1, bool))
)


def test_stop_tokens_and_the_context_limit(engine, policy):
  p = prompt_of(10)
  first = greedy_reference(policy, p, 1)[0]
  r = engine.generate([GenerateRequest(p, 20, temperature=0.0, stop_token_ids=[first])])[0]
  assert r.output_ids == [first] and r.finish_reason == "stop"
  r = engine.generate([GenerateRequest(prompt_of(60), 20, temperature=0.0)])[0]
  assert r.finish_reason == "length" and len(r.output_ids) == 64 - 60


def test_bad_requests_name_the_field(engine):
  with pytest.raises(ValueError, match="input_ids"):
    engine.submit(GenerateRequest([1, 2, CFG.vocab_size]))
  with pytest.raises(ValueError, match="input_ids.*max_len"):
    engine.submit(GenerateRequest(list(range(64))))
  with pytest.raises(ValueError, match="top_p"):
    engine.submit(GenerateRequest([1], top_p=0.0))
  with pytest.raises(ValueError, match="max_new_tokens"):
    engine.submit(GenerateRequest([1], max_new_tokens=0))


def _chi2_pvalue(counts, probs, min_expected=5.0):
  """Pearson chi-square, bins of small expectation merged into one; no sample may have p = 0."""
  assert counts[probs == 0].sum() == 0, "sampled a token outside the kept set"
  n = counts.sum()
  big = probs * n >= min_expected
  obs, exp = counts[big], probs[big] * n
  if probs[~big].sum() > 0:
    obs, exp = np.append(obs, counts[~big].sum()), np.append(exp, probs[~big].sum() * n)
  if len(obs) < 2:
    return 1.0  # a single possible outcome: nothing to test beyond the assert above
  stat = np.sum((obs - exp) ** 2 / exp)
  return float(jax.scipy.special.gammaincc((len(obs) - 1) / 2, stat / 2))


@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_sampled_frequencies_match_the_model_softmax(engine, policy, top_p):
  """First tokens (prefill path) and second tokens after the commonest first (decode path)."""
  prompt = prompt_of(5)
  n = 1200
  results = engine.generate(
    [GenerateRequest(prompt, max_new_tokens=2, top_p=top_p, seed=s) for s in range(n)]
  )
  first = np.array([r.output_ids[0] for r in results])
  second = np.array([r.output_ids[1] for r in results])
  probs = _law(policy, prompt, top_p)
  assert _chi2_pvalue(np.bincount(first, minlength=CFG.vocab_size), probs) > 1e-3
  t1 = np.bincount(first).argmax()
  probs2 = _law(policy, [*prompt, int(t1)], top_p)
  counts2 = np.bincount(second[first == t1], minlength=CFG.vocab_size)
  assert _chi2_pvalue(counts2, probs2) > 1e-3
  assert np.all(probs[first] > 0) and np.all(probs2[second[first == t1]] > 0)
  lp = np.array([r.logprobs[0] for r in results])
  np.testing.assert_allclose(lp, np.log(probs[first]), atol=1e-4)


def _law(policy, prefix, top_p):
  """The sampling law after `prefix` at temperature 1 with `top_p`, by sorting."""
  p = np.asarray(jax.nn.softmax(next_logits(policy, prefix)), np.float64)
  order = np.argsort(-p)
  n = len(p) if top_p >= 1 else int(np.searchsorted(np.cumsum(p[order]), top_p) + 1)
  out = np.zeros_like(p)
  out[order[:n]] = p[order[:n]]
  return out / out.sum()


def test_sharded_weights_give_the_same_tokens_and_never_recompile(engine, policy):
  """The learner hands the engine weights sharded over its mesh (8 fake devices here)."""
  from sao_jax import config as config_lib
  from sao_jax import sharding

  c = config_lib.base_config()
  c.mesh.fsdp, c.mesh.tensor = 2, 2
  mesh, rules = sharding.make_mesh(c), sharding.rules_from(c)
  with sharding.use_mesh(mesh, rules):
    sharded = sharding.shard_model(nnx.merge(*nnx.split(policy)), mesh, rules)
  requests = [GenerateRequest(prompt_of(n, n), max_new_tokens=6, seed=n) for n in (3, 12)]
  # Same shapes and seed as the module's single-device engine, which is the reference.
  kwargs = dict(num_slots=4, max_len=64, prompt_buckets=(16,), prefill_batch=2, seed=3)
  with Engine(nnx.split(sharded), **kwargs) as eng:
    first = eng.generate(requests)
    eng.update_weights(nnx.state(sharded), version=1)
    again = eng.generate(requests)
    assert eng.num_compilations == 2
  reference = engine.generate(requests)
  for a, b, r in zip(first, again, reference, strict=True):
    assert a.output_ids == b.output_ids == r.output_ids and b.versions == [1] * 6
    np.testing.assert_allclose(a.logprobs, r.logprobs, atol=1e-5)


def test_nothing_recompiled_after_warmup(engine):
  """One decode step per window and one prefill per bucket, whatever ran before (weight swaps
  included)."""
  assert engine.num_compilations == len(WINDOWS) + len(BUCKETS)
  assert {k for k, n in engine._compiles.items() if n} == {
    *(f"decode_{w}" for w in WINDOWS),
    *(f"prefill_{b}" for b in BUCKETS),
  }


def test_default_windows_and_bad_windows(policy):
  from sao_jax.rollout import default_windows

  assert default_windows(1024) == (64, 128, 256, 512, 1024)
  assert default_windows(176) == (64, 128, 176) and default_windows(48) == (48,)
  with pytest.raises(ValueError, match="decode_windows"):
    Engine(policy, num_slots=1, max_len=64, decode_windows=(16, 128))  # past max_len
  with Engine(policy, num_slots=1, max_len=64, decode_windows=(16,)) as eng:
    assert eng.windows == (16, 64)  # max_len is always a window


def test_close_aborts_queued_and_in_flight_requests(engine):
  engine.pause()
  futures = [engine.submit(GenerateRequest(prompt_of(5), 30, seed=i)) for i in range(6)]
  engine.close()
  assert [f.result().finish_reason for f in futures] == ["abort"] * 6
  with pytest.raises(RuntimeError, match="close"):
    engine.submit(GenerateRequest([1, 2], 3))
