"""Sandboxed execution of untrusted tool code: `run_python` and `run_command`.

Every run is a separate process tree with its own process group, resource limits (CPU time, address
space, file size, open files, processes), a wall-clock timeout that kills the whole tree, a scratch
directory, no network, a clean environment and capped output. Two isolation levels:

* 'bwrap' (preferred): bubblewrap gives a read-only root, private size-limited /tmp, /dev and
  /proc, and new network, PID, IPC and UTS namespaces; run_python's scratch directory is a private
  tmpfs (bounded disk use). The PID namespace means the parent is invisible and every
  leftover process dies with the run. As root, the code runs under a fresh random uid, so
  RLIMIT_NPROC applies (root is exempt from it) and root-owned files stay read-only.
* 'rlimit' (fallback where bwrap cannot create namespaces): the same limits in a new session, plus
  a seccomp filter (no `socket`, `setsid`/`setpgid`, and for Python tool code no `fork`) and, where
  the kernel has it, Landlock (writes only inside the scratch directory, no TCP, no signals to
  processes outside). Weaker: the host filesystem stays readable, and without Landlock a root caller's
  code can write where root can. `isolation()` warns once when it falls back.

The limits are applied inside the child by `_jail.py` (no `preexec_fn`), so concurrent runs from
many threads are safe. Set SAO_SANDBOX=rlimit to force the fallback.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import marshal
import os
import pathlib
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

_JAIL = str(pathlib.Path(__file__).with_name("_jail.py"))
_LOCK = threading.Lock()
_PROBED: dict[str, str] = {}
_UID_BASE = 1_000_000  # random per-run uids (root callers) come from [base, base + 2**30)


@dataclasses.dataclass(frozen=True)
class SandboxResult:
  """What a sandboxed run produced.

  Attributes:
    stdout: captured standard output (utf-8, invalid bytes replaced), at most the output cap.
    stderr: captured standard error, same cap.
    exit_code: the process's exit status; negative -N when killed by signal N.
    timed_out: the wall-clock timeout fired and the whole process tree was killed.
    truncated: some output was dropped (over the cap); a run that floods output is killed.
    wall_s: wall-clock seconds of the run.
    isolation: 'bwrap' or 'rlimit'.
  """

  stdout: str
  stderr: str
  exit_code: int
  timed_out: bool
  truncated: bool
  wall_s: float
  isolation: str

  @property
  def ok(self) -> bool:
    """Exited with status 0 before the timeout."""
    return self.exit_code == 0 and not self.timed_out


def _bwrap_probe_argv(root: bool) -> list[str]:
  argv = ["bwrap", "--ro-bind", "/", "/", "--unshare-net", "--unshare-pid", "--unshare-ipc"]
  argv += [] if root else ["--unshare-user"]
  return [*argv, "--proc", "/proc", "--dev", "/dev", "--die-with-parent", "true"]


def isolation() -> str:
  """The isolation level this host supports: 'bwrap' or 'rlimit' (probed once, then cached)."""
  with _LOCK:
    if "level" not in _PROBED:
      level = "rlimit"
      if os.environ.get("SAO_SANDBOX", "") != "rlimit" and shutil.which("bwrap"):
        try:
          argv = _bwrap_probe_argv(os.geteuid() == 0)
          r = subprocess.run(argv, capture_output=True, timeout=10)
          level = "bwrap" if r.returncode == 0 else "rlimit"
        except (OSError, subprocess.TimeoutExpired):
          pass
      if level == "rlimit":
        logging.warning(
          "sao_jax sandbox: bubblewrap namespaces are unavailable, using the WEAKER rlimit+seccomp"
          " fallback (host files stay readable; no PID or network namespace)."
        )
      _PROBED["level"] = level
    return _PROBED["level"]


def fallback_can_limit_processes() -> bool:
  """Whether the rlimit fallback can bound process counts (RLIMIT_NPROC never binds root).

  True for a non-root caller, or for root when the interpreter is reachable by an unprivileged uid
  (then each run gets its own random uid). Otherwise the fallback blocks fork() for Python tool code
  but cannot bound shell commands.
  """
  return os.geteuid() != 0 or all(map(_world_reachable, _python_paths()))


def _world_reachable(path: str) -> bool:
  """True if every directory on the way to `path` lets others in (o+x)."""
  p = pathlib.Path(path)
  return all(os.stat(d).st_mode & 0o001 for d in [*reversed(p.parents), p] if d.exists())


def _reveal_args(paths: list[str]) -> list[str]:
  """bwrap args that make `paths` reachable for a non-root uid under a root-only parent (/root)."""
  args, done, bound = [], set(), []
  for path in sorted({os.path.realpath(p) for p in paths if os.path.exists(p)}):
    if _world_reachable(path) or any(path.startswith(b + "/") for b in bound):
      continue
    parts = pathlib.Path(path).parts
    prefixes = [str(pathlib.Path(*parts[:i])) for i in range(2, len(parts) + 1)]
    top = next(p for p in prefixes if not os.stat(p).st_mode & 0o001)
    if top not in done:  # a second tmpfs on the same place would hide earlier binds
      args += ["--perms", "0755", "--tmpfs", top]
      done.add(top)
    for d in prefixes[prefixes.index(top) + 1 : -1]:
      if d not in done:
        args += ["--perms", "0755", "--dir", d]
        done.add(d)
    args += ["--ro-bind", path, path]
    bound.append(path)
  return args


def _python_paths() -> list[str]:
  exe = os.path.realpath(sys.executable)
  return [
    sys.prefix,
    sys.base_prefix,
    sys.exec_prefix,
    os.path.dirname(os.path.dirname(exe)),
    os.path.dirname(_JAIL),
    *[p for p in sys.path if os.path.isabs(p)],
  ]


# Mounts replaced by a private tmpfs of this many MiB inside the sandbox.
_PRIVATE_MOUNTS = (("/tmp", 64), ("/var/tmp", 16), ("/run", 16), ("/dev/shm", 16))


def _rebind_hidden(paths: list[str]) -> list[str]:
  """bwrap args that bind back, read-only, those of `paths` the private tmpfs mounts would hide.

  An interpreter in a virtualenv under /tmp (a clone in /tmp/x with its .venv) must stay reachable.
  """
  mounts = {m for m, _ in _PRIVATE_MOUNTS}
  real = {os.path.realpath(p) for p in paths if os.path.exists(p)}
  hidden = sorted(p for p in real if any(p.startswith(m + "/") for m in mounts))
  args, made, bound = [], set(), []
  for path in hidden:
    if any(path.startswith(b + "/") for b in bound):
      continue
    for d in reversed(pathlib.Path(path).parents[:-2]):  # below the mount point, above `path`
      if str(d) not in made and str(d) not in mounts:
        args += ["--perms", "0755", "--dir", str(d)]
        made.add(str(d))
    args += ["--ro-bind", path, path]
    bound.append(path)
  return args


def _bwrap_argv(workdir: str, scratch: list[tuple[int, str]] | None, scratch_mb: int) -> list[str]:
  """The bubblewrap command line: read-only root, private /tmp, writable `workdir`, namespaces.

  Args:
    workdir: the working directory. With `scratch`, a fresh tmpfs of `scratch_mb` MiB (bounded
      disk use) into which each (fd, relative path) of `scratch` is copied; else the host
      directory, bound read-write.
    scratch: files to copy into the tmpfs, as open file descriptors.
    scratch_mb: size of the tmpfs.
  """
  root = os.geteuid() == 0
  argv = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
  for mount, mb in _PRIVATE_MOUNTS:
    if os.path.isdir(mount):
      argv += ["--size", str(mb << 20), "--tmpfs", mount]
  argv += _rebind_hidden(_python_paths())
  if root:  # the random uid must reach the interpreter even if it lives under /root
    argv += _reveal_args(_python_paths())
    argv += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
  else:
    argv += ["--unshare-user"]
  for mount, _ in _PRIVATE_MOUNTS:  # bwrap would create parents as 0700
    if workdir.startswith(mount + "/"):
      parents = pathlib.Path(workdir).relative_to(mount).parents
      for d in reversed([pathlib.Path(mount) / q for q in parents if str(q) != "."]):
        argv += ["--perms", "0755", "--dir", str(d)]
  if scratch is None:
    argv += ["--bind", workdir, workdir]
  else:
    argv += ["--perms", "0777", "--size", str(scratch_mb << 20), "--tmpfs", workdir]
    dirs = {str(p) for _, rel in scratch for p in pathlib.PurePath(rel).parents if str(p) != "."}
    for d in sorted(dirs, key=len):
      argv += ["--perms", "0777", "--dir", os.path.join(workdir, d)]
    for fd, rel in scratch:
      argv += ["--perms", "0666", "--file", str(fd), os.path.join(workdir, rel)]
  argv += ["--chdir", workdir, "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts"]
  return [*argv, "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--"]


def _sandbox_env(workdir: str, extra: dict[str, str] | None) -> dict[str, str]:
  venv_bin = os.path.dirname(sys.executable)
  env = {
    "PATH": f"{venv_bin}:/usr/local/bin:/usr/bin:/bin",
    "HOME": workdir,
    "TMPDIR": workdir,
    "LANG": "C.UTF-8",
    "PYTHONHASHSEED": "0",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONUNBUFFERED": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "MPLBACKEND": "Agg",
  }
  env.update(extra or {})
  return env


def _chown_tree(path: str, uid: int):
  os.chown(path, uid, uid)
  for dirpath, dirnames, filenames in os.walk(path):
    for name in dirnames + filenames:
      os.lchown(os.path.join(dirpath, name), uid, uid)


def _kill_group(proc: subprocess.Popen):
  with contextlib.suppress(ProcessLookupError, PermissionError):
    os.killpg(proc.pid, signal.SIGKILL)


def _communicate(proc: subprocess.Popen, deadline: float, cap: int):
  """Reads both pipes until EOF with at most `cap` bytes kept per stream.

  Returns:
    (stdout bytes, stderr bytes, timed_out, truncated). A run that writes more than 16 * cap bytes
    is killed (a flood, not useful output).
  """
  sel = selectors.DefaultSelector()
  bufs = {proc.stdout: bytearray(), proc.stderr: bytearray()}
  for f in bufs:
    sel.register(f, selectors.EVENT_READ)
  total, timed_out, truncated, exited_at = 0, False, False, None
  while sel.get_map():
    now = time.monotonic()
    if now >= deadline:
      timed_out = True
      break
    if exited_at is None and proc.poll() is not None:
      exited_at = now
    if exited_at is not None and now - exited_at > 0.2:  # leftovers holding the pipes open
      break
    for key, _ in sel.select(min(deadline - now, 0.05)):
      data = os.read(key.fd, 1 << 16)
      if not data:
        sel.unregister(key.fileobj)
        continue
      buf, total = bufs[key.fileobj], total + len(data)
      keep = max(0, cap - len(buf))
      buf += data[:keep]
      truncated |= len(data) > keep
      if total > 16 * cap:
        _kill_group(proc)
  sel.close()
  _kill_group(proc)
  return bytes(bufs[proc.stdout]), bytes(bufs[proc.stderr]), timed_out, truncated


@dataclasses.dataclass(frozen=True)
class _Limits:
  timeout_s: float
  memory_mb: int
  max_processes: int
  max_file_mb: int
  max_open_files: int
  max_output_bytes: int


def _spec_limits(lim: _Limits) -> dict:
  return dict(
    cpu_s=int(lim.timeout_s) + 1,
    as_bytes=lim.memory_mb << 20,
    fsize_bytes=lim.max_file_mb << 20,
    nofile=lim.max_open_files,
    nproc=lim.max_processes,
  )


def _finish_spec(spec: dict, workdir: str, level: str) -> dict:
  """Adds the uid, filters and package paths that `_jail.py` applies for this isolation level."""
  root = os.geteuid() == 0
  spec["site_dirs"] = _site_dirs()
  if root and (level == "bwrap" or fallback_can_limit_processes()):
    spec["uid"] = _UID_BASE + secrets.randbelow(1 << 30)  # root is exempt from RLIMIT_NPROC
    _chown_tree(workdir, spec["uid"])
  if level == "rlimit":
    block_fork = spec["mode"] == "python"
    spec["seccomp"] = dict(block_socket=True, block_setsid=True, block_fork=block_fork)
    spec["landlock_dir"] = workdir
    if not root and spec["limits"].get("nproc"):
      spec["limits"]["nproc"] += _count_own_processes()  # NPROC counts all the user's processes
  return spec


def _launch(
  spec: dict,
  workdir: str,
  lim: _Limits,
  level: str,
  env: dict[str, str] | None,
  scratch_mb: int | None = None,
) -> SandboxResult:
  """Starts `_jail.py SPEC` (in bwrap or directly) and collects its result.

  With `scratch_mb` (run_python under bwrap) the files of `workdir` are copied into a private
  tmpfs of that size; otherwise `workdir` itself is the writable working directory.
  """
  argv = [
    sys.executable,
    "-I",
    "-S",
    _JAIL,
    marshal.dumps(_finish_spec(spec, workdir, level)).hex(),
  ]
  fds = []
  if level == "bwrap":
    scratch = None
    if scratch_mb is not None:
      rels = [
        os.path.relpath(os.path.join(d, f), workdir)
        for d, _, names in os.walk(workdir)
        for f in names
      ]
      fds = [os.open(os.path.join(workdir, rel), os.O_RDONLY | os.O_CLOEXEC) for rel in rels]
      scratch = list(zip(fds, rels, strict=True))
    argv = _bwrap_argv(workdir, scratch, scratch_mb or 0) + argv
  start = time.monotonic()
  try:
    proc = subprocess.Popen(
      argv,
      cwd=workdir,
      env=_sandbox_env(workdir, env),
      stdin=subprocess.DEVNULL,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      start_new_session=True,
      close_fds=True,
      pass_fds=fds,
    )
  finally:
    for fd in fds:
      os.close(fd)
  try:
    out, err, timed_out, truncated = _communicate(proc, start + lim.timeout_s, lim.max_output_bytes)
  finally:
    _kill_group(proc)
    proc.wait()
    proc.stdout.close()
    proc.stderr.close()
  code = proc.returncode
  if level == "bwrap" and code > 128:  # bwrap reports a signal death as 128 + N
    code = -(code - 128)
  return SandboxResult(
    out.decode("utf-8", "replace"),
    err.decode("utf-8", "replace"),
    code,
    timed_out,
    truncated,
    time.monotonic() - start,
    level,
  )


def _site_dirs() -> list[str]:
  return [p for p in sys.path if p.endswith("-packages") and os.path.isdir(p)]


def _count_own_processes() -> int:
  uid, n = os.getuid(), 0
  for pid in os.listdir("/proc"):
    with contextlib.suppress(OSError):
      n += pid.isdigit() and os.stat(f"/proc/{pid}").st_uid == uid
  return n


def _write_files(root: str, files: dict[str, str | bytes] | None):
  for rel, content in (files or {}).items():
    path = os.path.normpath(os.path.join(root, rel))
    if os.path.isabs(rel) or not path.startswith(root + os.sep):
      raise ValueError(f"files: {rel!r} must be a relative path inside the scratch directory")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    mode = "wb" if isinstance(content, bytes) else "w"
    with open(path, mode) as f:
      f.write(content)


def run_python(
  code: str,
  *,
  timeout_s: float = 5.0,
  memory_mb: int = 512,
  files: dict[str, str | bytes] | None = None,
  max_output_bytes: int = 1 << 16,
  max_processes: int = 16,
  max_file_mb: int = 16,
  max_open_files: int = 64,
  max_scratch_mb: int = 64,
  isolation_level: str | None = None,
) -> SandboxResult:
  """Runs Python source in a fresh sandbox, as `python main.py` in an empty scratch directory.

  Args:
    code: the program; a traceback on error shows only its own frames (file "main.py").
    timeout_s: wall-clock limit; the whole process tree is killed at the deadline.
    memory_mb: address-space limit (RLIMIT_AS) of each process.
    files: extra files to place in the scratch directory, {relative path: content}.
    max_output_bytes: cap per stream; more is dropped and `truncated` is set.
    max_processes: RLIMIT_NPROC (processes and threads of the sandbox's uid).
    max_file_mb: largest file the code may write (RLIMIT_FSIZE).
    max_open_files: RLIMIT_NOFILE.
    max_scratch_mb: size of the scratch directory (a private tmpfs; bwrap only).
    isolation_level: 'bwrap' or 'rlimit'; default `isolation()`.

  Returns:
    A SandboxResult.
  """
  lim = _Limits(timeout_s, memory_mb, max_processes, max_file_mb, max_open_files, max_output_bytes)
  level = isolation_level or isolation()
  workdir = tempfile.mkdtemp(prefix="sao_sbx_")
  try:
    _write_files(workdir, {**(files or {}), "main.py": code})
    spec = dict(mode="python", code_file="main.py", limits=_spec_limits(lim))
    return _launch(spec, workdir, lim, level, None, scratch_mb=max_scratch_mb)
  finally:
    shutil.rmtree(workdir, ignore_errors=True)


def run_command(
  argv: list[str],
  *,
  cwd: str,
  timeout_s: float = 30.0,
  memory_mb: int = 2048,
  env: dict[str, str] | None = None,
  max_output_bytes: int = 1 << 16,
  max_processes: int = 128,
  max_file_mb: int = 64,
  max_open_files: int = 256,
  isolation_level: str | None = None,
) -> SandboxResult:
  """Runs a command in a sandbox whose only writable host directory is `cwd`.

  Args:
    argv: the command, e.g. ['bash', '-c', 'ls'] or ['python', '-m', 'pytest', '-q'] (the venv's
      bin directory is first on PATH).
    cwd: existing host directory: the working directory, writable; it persists across runs (a
      workspace). As root its files are handed to the run's random uid.
    timeout_s: wall-clock limit; the whole process tree is killed at the deadline.
    memory_mb: address-space limit of each process.
    env: extra environment variables (the environment is otherwise clean).
    max_output_bytes, max_processes, max_file_mb, max_open_files, isolation_level: as run_python.

  Returns:
    A SandboxResult.
  """
  if not argv:
    raise ValueError("argv: empty command")
  workdir = os.path.realpath(cwd)
  if not os.path.isdir(workdir):
    raise ValueError(f"cwd: {cwd!r} is not a directory")
  lim = _Limits(timeout_s, memory_mb, max_processes, max_file_mb, max_open_files, max_output_bytes)
  spec = dict(mode="exec", argv=list(argv), limits=_spec_limits(lim))
  return _launch(spec, workdir, lim, isolation_level or isolation(), env)
