"""sao_jax: Single-Rollout Asynchronous Optimization (arXiv 2607.07508) for agentic RL, in JAX.

Submodules are imported lazily by their users; `import sao_jax` stays cheap (no jax import).
"""

__version__ = "0.1.0"
