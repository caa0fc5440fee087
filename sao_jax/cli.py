"""Command-line config handling shared by `sao_jax.train`, `sao_jax.actor` and friends.

`config_flags` with `lock_config=True` already rejects unknown override fields, but with a Python
traceback. `check_overrides` runs first and turns a misspelled `--config.a.b=...` into one line that
names the field and suggests the closest real one; `ConfigError` from `validate` is printed the same
way.
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Sequence

from sao_jax import config as config_lib


def _leaf_paths(c: config_lib.ConfigDict, prefix: str = "") -> list[str]:
  out = []
  for k, v in c.items():
    path = f"{prefix}{k}"
    out.append(path)
    if isinstance(v, config_lib.ConfigDict):
      out.extend(_leaf_paths(v, path + "."))
  return out


def check_overrides(argv: Sequence[str], flag: str = "config") -> None:
  """Raises ConfigError for the first `--config.<path>=` override that names no field."""
  spec = None
  overrides = []
  for i, a in enumerate(argv):
    if a.startswith(f"--{flag}="):
      spec = a.split("=", 1)[1]
    elif a == f"--{flag}" and i + 1 < len(argv):
      spec = argv[i + 1]
    elif a.startswith(f"--{flag}."):
      overrides.append(a[len(f"--{flag}.") :].split("=", 1)[0])
  if spec is None or not overrides:
    return
  paths = set(_leaf_paths(config_lib.load(spec)))
  for o in overrides:
    if o not in paths:
      close = difflib.get_close_matches(o, sorted(paths), n=1)
      hint = f"; did you mean config.{close[0]}?" if close else ""
      raise config_lib.ConfigError(o, f"no such field{hint}")


def run(main, argv: Sequence[str] | None = None) -> None:
  """`absl.app.run(main)` with config errors reported as one line and exit status 2."""
  from absl import app

  argv = list(sys.argv if argv is None else argv)
  try:
    check_overrides(argv)
    app.run(main, argv=argv)
  except config_lib.ConfigError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
