"""A coding agent on SWE-bench-format tasks, with OpenHands-like tools.

Task record (SWE-bench fields, plus how to build the workspace offline):
  instance_id, repo, problem_statement, FAIL_TO_PASS, PASS_TO_PASS (pytest node ids), test_cmd;
  and either source_archive (+ archive_root, bug: {path, start, old, new}: a line-range edit that
  plants the bug; see swe_gen.py) for the 'local' runtime, or base_commit + an image for 'docker'.

Tools: execute_bash(command), view(path, view_range), str_replace(path, old_str, new_str),
create(path, file_text), submit(). Compact forms: `<sh>command</sh>` and `<submit></submit>`.
Paths are relative to the repository root (absolute paths inside it are accepted too).

Reward (at submit or at max_turns): 1 iff every FAIL_TO_PASS test passes and every PASS_TO_PASS test
still passes, judged in the sandbox on a fresh copy: pristine sources with the agent's edits to
non-test files, so editing the tests cannot earn reward.

Runtimes: 'local' (default; a sandboxed workspace copy, sao_jax.envs.sandbox) and 'docker' (SWE-bench
images, swe_docker.py; raises a clear error where no Docker engine is reachable).

References: Jimenez et al. 2024 (SWE-bench); Wang et al. 2024 (OpenHands); SAO §5 (SWE, <=300 turns).
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import tarfile
import tempfile
from typing import Any, ClassVar

from sao_jax.envs import base, sandbox
from sao_jax.envs import tools as tools_lib

PACKAGED = pathlib.Path(__file__).resolve().parent / "data"
_S = {"type": "string"}
TOOLS = [
  tools_lib.Tool(
    "execute_bash",
    "run a bash command in the repository root",
    {"command": dict(_S, description="the command")},
    ("command",),
    "sh",
    "command",
  ),
  tools_lib.Tool(
    "view",
    "show a file with line numbers, or list a directory",
    {
      "path": dict(_S, description="file or directory"),
      "view_range": {"type": "array", "description": "[first, last] line, optional"},
    },
    ("path",),
  ),
  tools_lib.Tool(
    "str_replace",
    "replace the one exact occurrence of old_str in a file",
    {"path": _S, "old_str": _S, "new_str": _S},
    ("path", "old_str", "new_str"),
  ),
  tools_lib.Tool(
    "create", "create or overwrite a file", {"path": _S, "file_text": _S}, ("path", "file_text")
  ),
  tools_lib.Tool("submit", "finish: your changes are tested", {}, (), "submit"),
]
_SYSTEM = (
  "You are a software engineer fixing an issue in a repository (your working directory; tool "
  "paths are relative to it). Explore the code, reproduce the problem, edit the source (not the "
  "tests), then submit.\n\n"
)


# ---------------------------------------------------------------------------------- workspaces
def _archive_path(task: dict[str, Any]) -> pathlib.Path:
  p = pathlib.Path(task["source_archive"])
  return p if p.is_absolute() else PACKAGED / p


def extract_pristine(task: dict[str, Any], dest: str) -> str:
  """Unpacks the task's source archive into `dest`; returns the repository root."""
  with tarfile.open(_archive_path(task)) as tar:
    tar.extractall(dest, filter="data")
  return os.path.join(dest, task.get("archive_root", ""))


def apply_edit(root: str, edit: dict[str, Any], *, reverse: bool = False):
  """Replaces lines [start, start + len(old)) of edit['path'] (old -> new, or new -> old)."""
  old, new = (edit["new"], edit["old"]) if reverse else (edit["old"], edit["new"])
  path = os.path.join(root, edit["path"])
  with open(path, encoding="utf-8") as f:
    lines = f.read().splitlines(keepends=True)
  i, n = edit["start"] - 1, len(old.splitlines(keepends=True))
  if "".join(lines[i : i + n]) != old:
    raise ValueError(
      f"{edit['path']}:{edit['start']}: the file does not contain the expected lines"
    )
  lines[i : i + n] = [new]
  with open(path, "w", encoding="utf-8") as f:
    f.write("".join(lines))


def prepare_workspace(task: dict[str, Any], dest: str) -> str:
  """The buggy repository of `task` in `dest`; returns its root."""
  root = extract_pristine(task, dest)
  if task.get("bug"):
    apply_edit(root, task["bug"])
  return root


def _is_test_path(rel: str) -> bool:
  parts = pathlib.PurePath(rel).parts
  return any(p in ("tests", "test", "testing") for p in parts[:-1]) or parts[-1].startswith("test_")


def parse_pytest_report(output: str) -> dict[str, str]:
  """{node id: 'PASSED' | 'FAILED' | 'ERROR' | ...} from pytest's `-rA` short summary."""
  status = {}
  pattern = r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (.+?)(?: - .*)?$"
  for m in re.finditer(pattern, output, re.M):
    status.setdefault(m.group(2), m.group(1))
  return status


def run_tests(
  root: str, task: dict[str, Any], node_ids: list[str], *, timeout_s: float = 300.0
) -> tuple[dict[str, str], sandbox.SandboxResult]:
  """Runs `task['test_cmd']` on `node_ids` in the sandbox; returns per-test statuses and the run."""
  files = sorted({n.split("::")[0] for n in node_ids})
  argv = ["bash", "-c", f"{task['test_cmd']} -rA --tb=short {' '.join(files)}"]
  r = sandbox.run_command(
    argv,
    cwd=root,
    timeout_s=timeout_s,
    memory_mb=2048,
    env={"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
    max_output_bytes=1 << 20,
  )
  return parse_pytest_report(r.stdout), r


def evaluate(task: dict[str, Any], workspace: str, *, timeout_s: float = 300.0) -> dict[str, Any]:
  """Judges a workspace on a fresh copy: pristine tests, the agent's non-test files.

  Returns:
    {'reward': 1.0 or 0.0, 'fail_to_pass': passed/total, 'pass_to_pass': passed/total,
     'test_status': per-test statuses}.
  """
  with tempfile.TemporaryDirectory(prefix="sao_swe_eval_") as tmp:
    os.chmod(tmp, 0o755)  # the sandbox's unprivileged uid must pass through it
    fresh = extract_pristine(task, tmp)
    for dirpath, _, filenames in os.walk(workspace):
      for name in filenames:
        src = os.path.join(dirpath, name)
        rel = os.path.relpath(src, workspace)
        if not _is_test_path(rel) and not os.path.islink(src) and "__pycache__" not in rel:
          os.makedirs(os.path.dirname(os.path.join(fresh, rel)), exist_ok=True)
          shutil.copyfile(src, os.path.join(fresh, rel))
    status, _ = run_tests(
      fresh, task, task["FAIL_TO_PASS"] + task["PASS_TO_PASS"], timeout_s=timeout_s
    )
  return verdict(task, status)


def verdict(task: dict[str, Any], status: dict[str, str]) -> dict[str, Any]:
  """Reward 1 iff every FAIL_TO_PASS and PASS_TO_PASS test PASSED, with the counts."""
  f2p, p2p = task["FAIL_TO_PASS"], task["PASS_TO_PASS"]
  ok = lambda ids: sum(status.get(i) == "PASSED" for i in ids)
  reward = float(ok(f2p) == len(f2p) and ok(p2p) == len(p2p))
  return dict(
    reward=reward,
    fail_to_pass=f"{ok(f2p)}/{len(f2p)}",
    pass_to_pass=f"{ok(p2p)}/{len(p2p)}",
    test_status=status,
  )


# ------------------------------------------------------------------------------------ runtimes
class LocalRuntime:
  """The task's repository in a temporary host directory; commands run in the sandbox."""

  def __init__(self, task: dict[str, Any], *, timeout_s: float, memory_mb: int):
    self.task, self.timeout_s, self.memory_mb = task, timeout_s, memory_mb
    self._tmp = tempfile.mkdtemp(prefix="sao_swe_")
    os.chmod(self._tmp, 0o755)  # the sandbox's unprivileged uid must pass through it
    self.root = os.path.realpath(prepare_workspace(task, self._tmp))

  def run(self, command: str) -> sandbox.SandboxResult:
    """Runs a bash command in the repository, sandboxed."""
    return sandbox.run_command(
      ["bash", "-c", command],
      cwd=self.root,
      timeout_s=self.timeout_s,
      memory_mb=self.memory_mb,
      env={"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
    )

  def resolve(self, path: str) -> str:
    """A host path inside the repository (symlinks resolved), else ValueError."""
    full = os.path.realpath(os.path.join(self.root, path))
    if full != self.root and not full.startswith(self.root + os.sep):
      raise ValueError(f"path {path!r} is outside the repository {self.root}")
    return full

  def is_dir(self, path: str) -> bool:
    """Whether `path` (repository-relative) is a directory."""
    return os.path.isdir(self.resolve(path))

  def read(self, path: str) -> str:
    """The text of a repository file."""
    with open(self.resolve(path), encoding="utf-8", errors="replace") as f:
      return f.read()

  def write(self, path: str, text: str):
    """Writes a repository file (parents created)."""
    full = self.resolve(path)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "w", encoding="utf-8") as f:
      f.write(text)

  def list_tree(self, path: str) -> list[str]:
    """Files and directories under `path`, two levels deep, hidden ones skipped."""
    top, out = self.resolve(path), []
    for dirpath, dirnames, filenames in os.walk(top):
      dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "__pycache__")))
      if os.path.relpath(dirpath, top).count(os.sep) + (dirpath != top) >= 2:
        dirnames[:] = []
      out += [
        os.path.relpath(os.path.join(dirpath, n), self.root)
        for n in sorted(dirnames) + sorted(filenames)
        if not n.startswith(".")
      ]
    return out

  def evaluate(self) -> dict[str, Any]:
    """Judges the current workspace (see `evaluate`)."""
    return evaluate(self.task, self.root)

  def close(self):
    """Deletes the workspace."""
    shutil.rmtree(self._tmp, ignore_errors=True)


RUNTIMES = ("local", "docker")


# --------------------------------------------------------------------------------- environment
def _numbered(text: str, first: int = 1) -> str:
  return "\n".join(f"{i:6d}\t{line}" for i, line in enumerate(text.splitlines(), first))


class SweEnv(base.ToolEnv):
  """Fix a SWE-bench-format issue with bash and file-editing tools; reward = the tests' verdict."""

  name = "swe"
  tools: ClassVar = TOOLS
  submit_tool = "submit"

  def __init__(
    self,
    *,
    max_turns: int = 300,
    timeout_s: float = 60.0,
    memory_mb: int = 2048,
    runtime: str = "local",
    **kwargs,
  ):
    super().__init__(max_turns=max_turns, **kwargs)
    if runtime not in RUNTIMES:
      raise ValueError(f"env.runtime: must be one of {sorted(RUNTIMES)}, got {runtime!r}")
    self.runtime_name, self.timeout_s, self.memory_mb = runtime, timeout_s, memory_mb
    self.runtime: LocalRuntime | None = None

  def on_reset(self, task: dict[str, Any]):
    self.close()
    if self.runtime_name == "docker":
      from sao_jax.envs.swe_docker import DockerRuntime as runtime_cls
    else:
      runtime_cls = LocalRuntime
    self.runtime = runtime_cls(task, timeout_s=self.timeout_s, memory_mb=self.memory_mb)

  def close(self):
    """Deletes the workspace (also done when the episode ends)."""
    if self.runtime is not None:
      self.runtime.close()
      self.runtime = None

  def system_prompt(self) -> str:
    """The task framing and the tools (the same for every task, so demonstrations are stable)."""
    return _SYSTEM + tools_lib.tools_prompt(self.tools, self.tool_format)

  def user_prompt(self, task: dict[str, Any]) -> str:
    return f"<issue>\n{task['problem_statement'].strip()}\n</issue>"

  def _finish(self) -> tuple[float, dict[str, Any]]:
    result = self.runtime.evaluate()
    self.close()
    return result["reward"], {k: v for k, v in result.items() if k != "test_status"}

  def submit_reward(self, call):
    return self._finish()

  def max_turns_reward(self):
    return self._finish()

  def final_reward(self, text: str) -> tuple[float, dict[str, Any]]:
    reward, extra = self._finish()  # a reply without a tool call ends the episode like submit
    return reward, dict(extra, finish_reason="answer")

  def execute(self, call: tools_lib.ToolCall) -> str:
    try:
      return getattr(self, f"_tool_{call.name}")(**call.arguments)
    except (ValueError, OSError, TypeError) as e:
      self.counts["tool_errors"] += 1
      return f"Error: {e}"

  def _tool_execute_bash(self, command: str) -> str:
    r = self.runtime.run(str(command))
    self.counts["tool_errors"] += not r.ok
    text = base.format_result(r, timeout_s=self.timeout_s)
    return text if r.exit_code <= 0 else f"{text}\n[exit code {r.exit_code}]"

  def _tool_view(self, path: str, view_range: list[int] | None = None) -> str:
    if self.runtime.is_dir(path):
      return "\n".join(self.runtime.list_tree(path))
    text = self.runtime.read(path)
    if view_range:
      first, last = int(view_range[0]), int(view_range[-1])
      lines = text.splitlines()
      last = len(lines) if last == -1 else last
      return _numbered("\n".join(lines[first - 1 : last]), first)
    return _numbered(text)

  def _tool_str_replace(self, path: str, old_str: str, new_str: str) -> str:
    text = self.runtime.read(path)
    count = text.count(old_str) if old_str else 0
    if count != 1:
      where = [text[: m.start()].count("\n") + 1 for m in re.finditer(re.escape(old_str), text)]
      why = "did not appear verbatim" if count == 0 else f"appears {count} times (lines {where})"
      raise ValueError(f"no replacement was performed: old_str {why} in {path}")
    start = text[: text.index(old_str)].count("\n") + 1
    text = text.replace(old_str, new_str)
    self.runtime.write(path, text)
    lines = text.splitlines()
    lo, hi = max(start - 4, 0), start + new_str.count("\n") + 4
    snippet = _numbered("\n".join(lines[lo:hi]), lo + 1)
    return f"Edited {path}. Lines {lo + 1}-{min(hi, len(lines))}:\n{snippet}"

  def _tool_create(self, path: str, file_text: str) -> str:
    self.runtime.write(path, file_text)
    return f"File created: {path} ({len(file_text)} characters)"


def demonstration(task: dict[str, Any], tool_format: str = "qwen3") -> list[base.Message]:
  """A correct trace: view the buggy lines, undo the planted bug with str_replace, submit.

  The observations are produced by a real SweEnv on the task, so they equal what the env returns.
  """
  env = SweEnv(tool_format=tool_format)
  messages = env.reset(task)
  bug = task["bug"]
  n = bug["new"].count("\n") or 1
  calls = [
    tools_lib.ToolCall(
      "view", {"path": bug["path"], "view_range": [bug["start"], bug["start"] + n - 1]}
    ),
    tools_lib.ToolCall(
      "str_replace", {"path": bug["path"], "old_str": bug["new"], "new_str": bug["old"]}
    ),
  ]
  try:
    for call in calls:
      messages.append(
        dict(role="assistant", content=tools_lib.render_call(call, env.tools, tool_format))
      )
      messages.append(dict(role="tool", content=env.step(messages[-1]["content"]).observation))
    submit = tools_lib.render_call(tools_lib.ToolCall("submit", {}), env.tools, tool_format)
    messages.append(dict(role="assistant", content=submit))
  finally:
    env.close()
  return messages
