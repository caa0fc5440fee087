"""The 'docker' runtime of the SWE environment: SWE-bench images through the Docker CLI.

The repository lives at /testbed in a container started with no network; commands run through
`docker exec` under coreutils `timeout`, file tools read and write through `docker exec`, and judging
resets the test files to base_commit, applies the task's test_patch, runs test_cmd and compares the
per-test statuses (swe.verdict). Needs a running Docker engine; raises a clear error otherwise.

References: Jimenez et al. 2024 (SWE-bench evaluation images and harness).
"""

from __future__ import annotations

import posixpath
import re
import shutil
import subprocess
import time
from typing import Any

from sao_jax.envs import sandbox
from sao_jax.envs.swe import parse_pytest_report, verdict


def swebench_image(instance_id: str) -> str:
  """SWE-bench's published evaluation image of an instance."""
  return f"swebench/sweb.eval.x86_64.{instance_id.replace('__', '_1776_').lower()}:latest"


class DockerRuntime:
  """A container of the task's SWE-bench image, repository at /testbed, no network.

  The image is task['image'] or SWE-bench's published image of the instance. Judging resets the
  test files to base_commit, applies test_patch, runs test_cmd and compares per-test statuses.
  """

  def __init__(self, task: dict[str, Any], *, timeout_s: float, memory_mb: int):
    self.docker = shutil.which("docker")
    if not self.docker or subprocess.run([self.docker, "info"], capture_output=True).returncode:
      raise RuntimeError(
        "env.runtime='docker' needs a running Docker engine (`docker info` "
        "failed or docker is not installed); use env.runtime='local'"
      )
    self.task, self.timeout_s = task, timeout_s
    self.root = task.get("workdir", "/testbed")
    image = task.get("image") or swebench_image(task["instance_id"])
    out = self._docker(
      "run",
      "-d",
      "--network",
      "none",
      f"--memory={memory_mb}m",
      "-w",
      self.root,
      image,
      "sleep",
      "infinity",
    )
    self.cid = out.stdout.strip()

  def _docker(self, *args, stdin: str | None = None, timeout: float = 600, check: bool = True):
    r = subprocess.run(
      [self.docker, *args], input=stdin, capture_output=True, text=True, timeout=timeout
    )
    if check and r.returncode:
      raise RuntimeError(f"docker {args[0]} failed: {r.stderr.strip()[-500:]}")
    return r

  def run(self, command: str) -> sandbox.SandboxResult:
    """Runs a bash command in the container under `timeout`."""
    start, t = time.monotonic(), int(self.timeout_s)
    r = self._docker(
      "exec",
      "-w",
      self.root,
      self.cid,
      "timeout",
      "-s",
      "KILL",
      str(t),
      "bash",
      "-c",
      command,
      timeout=self.timeout_s + 30,
      check=False,
    )
    cap = 1 << 16
    return sandbox.SandboxResult(
      r.stdout[:cap],
      r.stderr[:cap],
      r.returncode,
      r.returncode == 137,
      len(r.stdout) > cap or len(r.stderr) > cap,
      time.monotonic() - start,
      "docker",
    )

  def resolve(self, path: str) -> str:
    """A container path inside the repository, else ValueError."""
    full = posixpath.normpath(posixpath.join(self.root, path))
    if full != self.root and not full.startswith(self.root + "/"):
      raise ValueError(f"path {path!r} is outside the repository {self.root}")
    return full

  def is_dir(self, path: str) -> bool:
    """Whether `path` is a directory in the container."""
    return not self._docker(
      "exec", self.cid, "test", "-d", self.resolve(path), check=False
    ).returncode

  def read(self, path: str) -> str:
    """The text of a file in the container."""
    r = self._docker("exec", self.cid, "cat", "--", self.resolve(path), check=False)
    if r.returncode:
      raise OSError(r.stderr.strip() or f"cannot read {path}")
    return r.stdout

  def write(self, path: str, text: str):
    """Writes a file in the container (parents created)."""
    script = 'mkdir -p "$(dirname "$1")" && cat > "$1"'
    self._docker("exec", "-i", self.cid, "sh", "-c", script, "_", self.resolve(path), stdin=text)

  def list_tree(self, path: str) -> list[str]:
    """Paths under `path`, two levels deep, hidden ones skipped."""
    r = self._docker(
      "exec",
      self.cid,
      "find",
      self.resolve(path),
      "-mindepth",
      "1",
      "-maxdepth",
      "2",
      "-not",
      "-path",
      "*/.*",
    )
    return sorted(posixpath.relpath(p, self.root) for p in r.stdout.split("\n") if p)

  def evaluate(self) -> dict[str, Any]:
    """Resets the tests, applies test_patch, runs them, and judges."""
    t = self.task
    files = re.findall(r"^\+\+\+ b/(\S+)", t.get("test_patch", ""), re.M)
    if files and t.get("base_commit"):
      self._docker(
        "exec",
        "-w",
        self.root,
        self.cid,
        "git",
        "checkout",
        t["base_commit"],
        "--",
        *files,
        check=False,
      )
    if t.get("test_patch"):
      self._docker(
        "exec", "-i", "-w", self.root, self.cid, "git", "apply", "-", stdin=t["test_patch"]
      )
    test_files = sorted({i.split("::")[0] for i in t["FAIL_TO_PASS"] + t["PASS_TO_PASS"]})
    r = self.run(f"{t['test_cmd']} -rA --tb=no {' '.join(test_files)}")
    return verdict(t, parse_pytest_report(r.stdout))

  def close(self):
    """Removes the container."""
    self._docker("rm", "-f", self.cid, check=False)
