"""Regenerates the Python gRPC modules from `replay.proto`: `python -m sao_jax.replay.gen`.

Writes `replay_pb2.py`, `replay_pb2.pyi` and `replay_pb2_grpc.py` next to the proto. The include
root is the repository root, so the generated imports read `from sao_jax.replay import replay_pb2`
and work when sao_jax is imported as a package. Needs grpcio-tools (in requirements.txt).
"""

from __future__ import annotations

import argparse
import pathlib
import sys

PROTO = pathlib.Path(__file__).with_name("replay.proto")
ROOT = PROTO.parents[2]  # the directory that holds the sao_jax package
PROTO_REL = "sao_jax/replay/replay.proto"


def generate(out_dir: str | pathlib.Path = ROOT) -> list[pathlib.Path]:
  """Runs protoc (from grpc_tools) on replay.proto.

  Args:
    out_dir: root to write under; files land in `out_dir/sao_jax/replay/`.

  Returns:
    The paths written.
  """
  from grpc_tools import protoc  # only needed here, so imported lazily

  out_dir = pathlib.Path(out_dir)
  (out_dir / "sao_jax" / "replay").mkdir(parents=True, exist_ok=True)
  args = ["protoc", f"-I{ROOT}", f"--python_out={out_dir}", f"--pyi_out={out_dir}",
          f"--grpc_python_out={out_dir}", PROTO_REL]  # fmt: skip
  if protoc.main(args) != 0:
    raise RuntimeError(f"protoc failed on {PROTO}")
  base = out_dir / "sao_jax" / "replay"
  return [base / n for n in ("replay_pb2.py", "replay_pb2.pyi", "replay_pb2_grpc.py")]


def main(argv: list[str] | None = None) -> int:
  """CLI entry point: regenerates the modules and prints their paths; returns the exit code."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", default=str(ROOT), help="root directory to write under")
  args = parser.parse_args(argv)
  for path in generate(args.out):
    print(path)
  return 0


if __name__ == "__main__":
  sys.exit(main())
