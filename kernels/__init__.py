"""Fused kernels (Pallas on TPU/GPU, interpret mode or XLA on CPU), each with a pure-jnp reference."""
