"""Builds validated SWE-bench-format tasks the SWE-smith way, offline, from a source package.

    python -m sao_jax.envs.swe_gen --archive boltons-26.2.0.tar.gz \\
        --modules iterutils,strutils,dictutils --max_tasks 24 --out tasks.jsonl

For each module `<pkg>/<m>.py` with tests in `tests/test_<m>.py`: run the tests on the pristine
source (only tests that pass are used), apply single AST mutations (flip a comparison, swap an
arithmetic or boolean operator, change an integer constant by one), keep the mutants that break 1-3
tests, and write a record per kept mutant: FAIL_TO_PASS = the broken tests, PASS_TO_PASS = the rest
of the file's passing tests, the planted bug as a line-range edit, the gold patch as a diff, and a
problem statement built from the failing assertions without naming the mutated file or line.

Validation (`--validate`, on by default): the pristine source passes every listed test, the mutant
fails exactly FAIL_TO_PASS, and undoing the bug through SweEnv's own str_replace tool, then
submitting, earns reward 1.

References: Yang et al. 2025, "SWE-smith: Scaling Data for Software Engineering Agents".
"""

from __future__ import annotations

import argparse
import ast
import difflib
import hashlib
import json
import os
import random
import tempfile
from typing import Any

from tqdm import tqdm

from sao_jax.envs import swe
from sao_jax.envs import tools as tools_lib

_CMP = {
  ast.Lt: ast.LtE,
  ast.LtE: ast.Lt,
  ast.Gt: ast.GtE,
  ast.GtE: ast.Gt,
  ast.Eq: ast.NotEq,
  ast.NotEq: ast.Eq,
  ast.Is: ast.IsNot,
  ast.IsNot: ast.Is,
  ast.In: ast.NotIn,
  ast.NotIn: ast.In,
}
_BIN = {
  ast.Add: ast.Sub,
  ast.Sub: ast.Add,
  ast.Mult: ast.FloorDiv,
  ast.FloorDiv: ast.Mult,
  ast.Div: ast.Mult,
  ast.Mod: ast.FloorDiv,
  ast.BitAnd: ast.BitOr,
  ast.BitOr: ast.BitAnd,
}
TEST_CMD = "python -m pytest -q -p no:cacheprovider"


def mutations(source: str) -> list[tuple[int, str, str]]:
  """Single-node mutations of a module: (line number, original line, mutated line).

  Only nodes on one line are mutated; the node's text is replaced by the unparsed mutant.
  """
  lines = source.splitlines(keepends=True)
  out = []
  for node in ast.walk(ast.parse(source)):
    if getattr(node, "end_lineno", None) != getattr(node, "lineno", -1):
      continue
    variants = []
    if isinstance(node, ast.Compare):
      for k, op in enumerate(node.ops):
        if type(op) in _CMP:
          variants.append(
            ast.Compare(
              node.left, [*node.ops[:k], _CMP[type(op)](), *node.ops[k + 1 :]], node.comparators
            )
          )
    elif isinstance(node, ast.BinOp) and type(node.op) in _BIN:
      variants.append(ast.BinOp(node.left, _BIN[type(node.op)](), node.right))
    elif isinstance(node, ast.BoolOp):
      variants.append(
        ast.BoolOp(ast.Or() if isinstance(node.op, ast.And) else ast.And(), node.values)
      )
    elif isinstance(node, ast.Constant) and type(node.value) is int and abs(node.value) < 1000:
      variants.append(ast.Constant(node.value + 1))
    line = lines[node.lineno - 1]
    raw = line.encode()
    for v in variants:
      new = raw[: node.col_offset].decode() + ast.unparse(v) + raw[node.end_col_offset :].decode()
      if new != line:
        out.append((node.lineno, line, new))
  return out


def _unique_edit(path: str, lines: list[str], lineno: int, new_line: str) -> dict[str, Any]:
  """The bug as an edit whose mutated text occurs once in the mutated file (grows context)."""
  mutated = [*lines[: lineno - 1], new_line, *lines[lineno:]]
  text = "".join(mutated)
  lo = hi = lineno - 1
  while text.count("".join(mutated[lo : hi + 1])) > 1 and (lo > 0 or hi < len(lines) - 1):
    lo, hi = max(lo - 1, 0), min(hi + 1, len(lines) - 1)
  return dict(
    path=path, start=lo + 1, old="".join(lines[lo : hi + 1]), new="".join(mutated[lo : hi + 1])
  )


def _failure_text(output: str, test: str, banned: list[str]) -> str:
  """The 'E ...' lines of `test`'s failure in pytest's --tb=short output, minus banned text."""
  name = test.split("::")[-1]
  sections = output.split("\n___")
  body = next((s for s in sections if f" {name} _" in s.split("\n", 1)[0]), "")
  keep = [ln for ln in body.splitlines() if ln.startswith("E ")]
  keep = [ln for ln in keep if not any(b in ln for b in banned)][:8]
  return "\n".join(keep) if keep else "E   the test fails"


def problem_statement(package: str, failing: list[str], output: str, banned: list[str]) -> str:
  """An issue text from the failing behaviour, without naming the mutated location."""
  parts = [
    f"Something is broken in `{package}`: "
    f"{len(failing)} test{'s' if len(failing) > 1 else ''} that used to pass now fail."
  ]
  for test in failing:
    parts.append(f"\n`{test}` fails with:\n```\n{_failure_text(output, test, banned)}\n```")
  parts.append("\nPlease fix the library code so these tests pass again (do not edit the tests).")
  return "\n".join(parts)


def gold_patch(lines: list[str], edit: dict[str, Any]) -> str:
  """The fix as a unified diff of the whole file (buggy -> original), as SWE-bench's 'patch'."""
  i, n = edit["start"] - 1, len(edit["old"].splitlines())
  buggy = [*lines[:i], *edit["new"].splitlines(keepends=True), *lines[i + n :]]
  path = edit["path"]
  return "".join(difflib.unified_diff(buggy, lines, f"a/{path}", f"b/{path}"))


def _task_record(
  archive, root_name, package, module, edit, f2p, p2p, output, lines
) -> dict[str, Any]:
  path = edit["path"]
  patch = gold_patch(lines, edit)
  banned = [path, module + ".py", edit["new"].strip()[:40]]
  digest = hashlib.sha1(edit["new"].encode()).hexdigest()[:6]
  inside = os.path.dirname(os.path.realpath(archive)) == str(swe.PACKAGED)
  source = os.path.basename(archive) if inside else os.path.realpath(archive)
  return dict(
    instance_id=f"{package}__{module}-L{edit['start']}-{digest}",
    repo=package,
    base_commit=None,
    source_archive=source,
    archive_root=root_name,
    problem_statement=problem_statement(package, f2p, output, banned),
    FAIL_TO_PASS=f2p,
    PASS_TO_PASS=p2p,
    test_cmd=TEST_CMD,
    bug=edit,
    patch=patch,
    test_patch="",
    version="1",
    hints_text="",
  )


def mutants_of_module(archive, root, package, module, *, rng, max_tries, max_tasks):
  """Kept mutants of one module as task records (runs the module's test file per mutant)."""
  path, test_file = f"{package}/{module}.py", f"tests/test_{module}.py"
  task = dict(source_archive=archive, test_cmd=TEST_CMD)
  base_status, _ = swe.run_tests(root, task, [test_file])
  passing = sorted(t for t, s in base_status.items() if s == "PASSED")
  with open(os.path.join(root, path), encoding="utf-8") as f:
    lines = f.read().splitlines(keepends=True)
  candidates = mutations("".join(lines))
  rng.shuffle(candidates)
  records = []
  for lineno, _, new_line in tqdm(candidates[:max_tries], desc=module, leave=False):
    edit = _unique_edit(path, lines, lineno, new_line)
    swe.apply_edit(root, edit)
    try:
      status, run = swe.run_tests(root, task, [test_file])
    finally:
      swe.apply_edit(root, edit, reverse=True)
    f2p = [t for t in passing if status.get(t) != "PASSED"]
    if 1 <= len(f2p) <= 3 and not run.timed_out:
      p2p = [t for t in passing if t not in f2p]
      records.append(
        _task_record(
          archive, os.path.basename(root), package, module, edit, f2p, p2p, run.stdout, lines
        )
      )
      if len(records) >= max_tasks:
        break
  return records


def validate(task: dict[str, Any]) -> list[str]:
  """Problems with a task (empty if valid): pristine passes, mutant fails exactly FAIL_TO_PASS,
  and undoing the bug with the agent's str_replace tool then submitting earns reward 1."""
  problems = []
  with tempfile.TemporaryDirectory() as tmp:
    os.chmod(tmp, 0o755)
    pristine = swe.evaluate(task, swe.extract_pristine(task, tmp))
    if pristine["reward"] != 1.0:
      problems.append(
        f"pristine source fails: {pristine['fail_to_pass']} F2P, {pristine['pass_to_pass']} P2P"
      )
  env = swe.SweEnv(tool_format="qwen3")
  env.reset(task)
  try:
    status, _ = swe.run_tests(env.runtime.root, task, task["FAIL_TO_PASS"] + task["PASS_TO_PASS"])
    failing = sorted(t for t in status if status[t] != "PASSED")
    if failing != sorted(task["FAIL_TO_PASS"]):
      problems.append(f"mutant fails {failing}, expected {task['FAIL_TO_PASS']}")
    bug = task["bug"]
    fix = tools_lib.ToolCall(
      "str_replace", dict(path=bug["path"], old_str=bug["new"], new_str=bug["old"])
    )
    obs = env.step(tools_lib.render_call(fix, env.tools, "qwen3")).observation
    result = env.step('<tool_call>{"name": "submit", "arguments": {}}</tool_call>')
    if result.reward != 1.0:
      problems.append(f"undoing the bug with str_replace earns {result.reward}: {obs[:200]}")
  finally:
    env.close()
  return problems


def main(argv=None):
  """Command line: generate, validate and write the task set."""
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--archive", default=str(swe.PACKAGED / "boltons-26.2.0.tar.gz"))
  p.add_argument("--package", default="boltons")
  p.add_argument("--modules", default="iterutils,strutils,dictutils,setutils,listutils,mathutils")
  p.add_argument("--max_tasks", type=int, default=24)
  p.add_argument("--max_tries_per_module", type=int, default=40)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--out", required=True)
  p.add_argument("--no_validate", action="store_true")
  args = p.parse_args(argv)
  modules = args.modules.split(",")
  rng = random.Random(args.seed)
  records = []
  with tempfile.TemporaryDirectory() as tmp:
    os.chmod(tmp, 0o755)
    root = swe.extract_pristine(
      dict(source_archive=args.archive, archive_root=_archive_root(args.archive)), tmp
    )
    per_module = -(-args.max_tasks // len(modules))
    for module in tqdm(modules, desc="modules"):
      records += mutants_of_module(
        args.archive,
        root,
        args.package,
        module,
        rng=rng,
        max_tries=args.max_tries_per_module,
        max_tasks=per_module,
      )
  records = records[: args.max_tasks]
  if not args.no_validate:
    for r in tqdm(records, desc="validate"):
      problems = validate(r)
      if problems:
        raise SystemExit(f"{r['instance_id']}: {problems}")
  with open(args.out, "w", encoding="utf-8") as f:
    for r in records:
      f.write(json.dumps(r) + "\n")
  print(f"wrote {len(records)} tasks to {args.out}")


def _archive_root(archive: str) -> str:
  name = os.path.basename(archive)
  return name[: -len(".tar.gz")] if name.endswith(".tar.gz") else name


if __name__ == "__main__":
  main()
