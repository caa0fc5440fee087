"""Decoder throughput and model FLOP utilization (MFU) against the matmul peak measured in the run.

  python benchmarks/bench_model.py                       # tiny and smollm2_135m, batch 8 x 128
  python benchmarks/bench_model.py --models=smollm2_135m --batch=4 --seq=512

For each model: forward (`Policy.token_logprobs`, the training log-prob path through the fused
kernel) and forward+backward (its gradient w.r.t. all parameters) tokens/s, and MFU = model FLOPs
/ time / peak, where the peak is the best float32 GEMM rate XLA reaches on this machine in the same
run. Model FLOPs per token (PaLM appendix B convention, full T x T attention as computed):
forward 2 * P_matmul + 4 * L * T * N * H, forward+backward three times that; P_matmul counts every
weight matrix including the LM head, not the embedding gather. Random weights (speed does not
depend on values).
"""

from __future__ import annotations

import argparse
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from sao_jax import models


def _best_time(fn, *args, repeats: int) -> float:
  jax.block_until_ready(fn(*args))  # compile + warm up
  best = float("inf")
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    best = min(best, time.perf_counter() - t0)
  return best


def matmul_peak(repeats: int = 5) -> tuple[float, int]:
  """Best float32 GEMM FLOP/s over a few square sizes, and the size that reached it."""
  best, best_n = 0.0, 0
  for n in (512, 1024, 2048):
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
    t = _best_time(jax.jit(jnp.dot), a, b, repeats=repeats)
    if 2 * n**3 / t > best:
      best, best_n = 2 * n**3 / t, n
  return best, best_n


def flops_per_token(cfg: models.ModelConfig, seq: int) -> float:
  """Forward model FLOPs per token: 2 * matmul params + full-T attention scores and values."""
  d, n, k, h, layers = cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.num_layers
  attn = d * h * (n + 2 * k) + n * h * d
  mlp = 3 * d * cfg.mlp_dim
  if cfg.is_moe:
    mlp = cfg.experts_per_token * 3 * d * cfg.moe_mlp_dim + d * cfg.num_experts
  matmul_params = layers * (attn + mlp) + d * cfg.vocab_size
  return 2 * matmul_params + 4 * layers * seq * n * h


def bench_model(name: str, batch: int, seq: int, repeats: int) -> dict[str, float]:
  """Forward and forward+backward seconds per batch for one preset."""
  cfg = models.get_preset(name)
  policy = models.Policy(cfg, rngs=nnx.Rngs(0))
  tokens = jax.random.randint(jax.random.key(0), (batch, seq), 0, cfg.vocab_size)
  fwd = jax.jit(lambda m, t: m.token_logprobs(t)[0])
  loss = lambda m, t: jnp.mean(m.token_logprobs(t)[0])
  fwd_bwd = jax.jit(nnx.grad(loss))
  n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(policy, nnx.Param)))
  return dict(
    params=n_params,
    fwd=_best_time(fwd, policy, tokens, repeats=repeats),
    fwd_bwd=_best_time(fwd_bwd, policy, tokens, repeats=repeats),
    flops_tok=flops_per_token(cfg, seq),
  )


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--models", default="tiny,smollm2_135m")
  ap.add_argument("--batch", type=int, default=8)
  ap.add_argument("--seq", type=int, default=128)
  ap.add_argument("--repeats", type=int, default=3)
  args = ap.parse_args()
  peak, n = matmul_peak()
  print(
    f"backend {jax.default_backend()}, {os.cpu_count()} CPUs; float32 GEMM peak "
    f"{peak / 1e9:.1f} GFLOP/s (n={n}); batch {args.batch} x {args.seq} tokens"
  )
  tokens = args.batch * args.seq
  rows = [
    (name, bench_model(name, args.batch, args.seq, args.repeats)) for name in args.models.split(",")
  ]
  # Measure the peak again after the models: on a shared machine the best of both is the fairer peak.
  peak = max(peak, matmul_peak()[0])
  print(f"peak after the models: {peak / 1e9:.1f} GFLOP/s (MFU uses the larger)")
  print("| model | params | fwd tok/s | fwd+bwd tok/s | fwd MFU | fwd+bwd MFU |")
  print("|---|---|---|---|---|---|")
  for name, r in rows:
    mfu_f = r["flops_tok"] * tokens / r["fwd"] / peak
    mfu_fb = 3 * r["flops_tok"] * tokens / r["fwd_bwd"] / peak
    print(
      f"| {name} | {r['params'] / 1e6:.2f}M | {tokens / r['fwd']:,.0f} | "
      f"{tokens / r['fwd_bwd']:,.0f} | {100 * mfu_f:.0f}% | {100 * mfu_fb:.0f}% |"
    )


if __name__ == "__main__":
  main()
