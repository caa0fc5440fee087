"""Tests for sao_jax.envs.sandbox: results, limits, and a hostile-code suite at every isolation level.

Each hostile program runs with tight limits and must be contained and reported while this (the
host) process stays unharmed. The suite runs under bubblewrap where the host allows it and always
under the weaker rlimit fallback.
"""

import concurrent.futures
import os
import pathlib
import signal
import socket
import subprocess
import tempfile
import time
import uuid

import pytest

from sao_jax.envs import sandbox

LEVELS = ["rlimit"] + (["bwrap"] if sandbox.isolation() == "bwrap" else [])


@pytest.fixture(params=LEVELS)
def level(request):
  return request.param


def test_hello_and_traceback(level):
  r = sandbox.run_python("print(6 * 7)\n", isolation_level=level)
  assert (r.stdout, r.stderr, r.exit_code, r.timed_out, r.ok) == ("42\n", "", 0, False, True)
  r = sandbox.run_python("x = 1\n1 / 0\n", isolation_level=level)
  assert r.exit_code == 1 and r.stdout == ""
  assert r.stderr.splitlines()[1:2] == ['  File "main.py", line 2, in <module>']
  assert r.stderr.rstrip().endswith("ZeroDivisionError: division by zero")
  assert sandbox.run_python("import sys; sys.exit(3)", isolation_level=level).exit_code == 3


def test_files_and_imports(level):
  files = {"helper.py": "def f(x):\n  return x + 1\n", "data/in.txt": "41"}
  code = "import helper, numpy\nprint(helper.f(int(open('data/in.txt').read())), numpy.int64(2))"
  r = sandbox.run_python(code, files=files, isolation_level=level)
  assert r.stdout == "42 2\n", r.stderr
  with pytest.raises(ValueError, match="files"):
    sandbox.run_python("", files={"../x": "1"})


def test_run_command_workspace_persists(level, tmp_path):
  ws = tmp_path / "ws"
  ws.mkdir()
  (ws / "a.txt").write_text("hello\n")
  r = sandbox.run_command(
    ["bash", "-c", "cat a.txt; echo world >> a.txt; echo new > b.txt; pwd"],
    cwd=str(ws),
    timeout_s=10,
    isolation_level=level,
  )
  assert r.ok, r.stderr
  assert r.stdout == f"hello\n{os.path.realpath(ws)}\n"
  assert (ws / "a.txt").read_text() == "hello\nworld\n" and (ws / "b.txt").read_text() == "new\n"
  r = sandbox.run_command(["no-such-binary-xyz"], cwd=str(ws), isolation_level=level)
  assert r.exit_code == 127 and "cannot run" in r.stderr
  with pytest.raises(ValueError, match="cwd"):
    sandbox.run_command(["true"], cwd=str(ws / "missing"))


# ------------------------------------------------------------------------------ hostile code suite
def test_infinite_loop_times_out(level):
  r = sandbox.run_python("while True:\n  pass\n", timeout_s=1.0, isolation_level=level)
  assert r.timed_out and not r.ok and r.exit_code < 0
  assert r.wall_s < 3.0


def _live_with(marker: str) -> int:
  """Processes (not zombies: their cmdline is empty) whose command line contains `marker`."""
  n = 0
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
      with open(f"/proc/{pid}/cmdline", "rb") as f:
        n += marker.encode() in f.read()
    except OSError:
      pass
  return n


def _none_left(marker: str, within_s: float = 3.0) -> bool:
  # Counting only marked processes keeps the test exact while other work runs on the machine.
  deadline = time.monotonic() + within_s
  while _live_with(marker) and time.monotonic() < deadline:
    time.sleep(0.05)
  return _live_with(marker) == 0


def test_fork_bomb_is_contained(level):
  marker = f"sao-bomb-{uuid.uuid4().hex}"
  bomb = "import os\nwhile True:\n  try:\n    os.fork()\n  except OSError:\n    pass\n"
  # Re-exec with the marker on the command line; forked children inherit it.
  code = f"import os, sys\nos.execv(sys.executable, [sys.executable, '-c', {bomb!r}, {marker!r}])\n"
  r = sandbox.run_python(code, timeout_s=1.5, max_processes=16, isolation_level=level)
  assert r.timed_out and r.wall_s < 5.0
  assert _none_left(marker)  # every forked process died with the run


def test_shell_fork_bomb_is_contained(level, tmp_path):
  if level == "rlimit" and os.geteuid() == 0 and not sandbox.fallback_can_limit_processes():
    pytest.skip("rlimit fallback as root with an interpreter only root can reach: no uid to limit")
  marker = f"sao-bomb-{uuid.uuid4().hex}"
  r = sandbox.run_command(
    ["bash", "-c", "f() { f | f & }; f; sleep 5", marker],  # $0 = marker, inherited by subshells
    cwd=str(tmp_path),
    timeout_s=2.0,
    max_processes=32,
    isolation_level=level,
  )
  assert r.wall_s < 6.0
  assert _none_left(marker)


def test_memory_bomb_is_contained(level):
  r = sandbox.run_python("x = bytearray(8 << 30)\n", memory_mb=256, isolation_level=level)
  assert r.exit_code == 1 and "MemoryError" in r.stderr
  code = "a = []\nwhile True:\n  a.append(bytearray(1 << 20))\n"
  r = sandbox.run_python(code, memory_mb=256, timeout_s=5.0, isolation_level=level)
  assert not r.ok and not r.timed_out and "MemoryError" in r.stderr


def test_output_flood_is_truncated(level):
  code = "import sys\nwhile True:\n  sys.stdout.write('x' * 65536)\n  sys.stderr.write('y' * 999)\n"
  r = sandbox.run_python(code, timeout_s=10.0, max_output_bytes=4096, isolation_level=level)
  assert r.truncated and not r.ok
  assert r.stdout == "x" * 4096 and len(r.stderr) <= 4096
  assert r.wall_s < 5.0  # killed for flooding, well before the timeout


def test_disk_filling_is_bounded(level):
  big = "open('big', 'wb').write(b'x' * (32 << 20))\n"
  r = sandbox.run_python(big, max_file_mb=16, memory_mb=512, isolation_level=level)
  assert r.exit_code == 1 and "File too large" in r.stderr  # RLIMIT_FSIZE, every level
  if level != "bwrap":
    return  # the fallback bounds each file and the time, not the total: not run on the host disk
  many = (
    "n = 0\ntry:\n  while True:\n    open(f'f{n}', 'wb').write(b'x' * (1 << 20))\n"
    "    n += 1\nexcept OSError as e:\n  print(n, e.strerror)\n"
  )
  r = sandbox.run_python(many, max_scratch_mb=16, timeout_s=5.0, isolation_level=level)
  assert r.ok and r.stdout.split(" ", 1)[1] == "No space left on device\n", r.stdout
  assert int(r.stdout.split()[0]) <= 16  # the scratch directory is a tmpfs of max_scratch_mb


def test_writes_outside_scratch_are_blocked(level):
  outside = tempfile.mkdtemp(dir=os.getcwd(), prefix=".sandbox_canary_")
  try:
    os.chmod(outside, 0o777)  # writable by anyone: only the sandbox may stop the write
    canary = os.path.join(outside, "canary.txt")
    with open(canary, "w") as f:
      f.write("intact")
    os.chmod(canary, 0o666)
    code = (
      f"for p, m in [({canary!r}, 'w'), ({outside + '/new.txt'!r}, 'w')]:\n"
      "  try:\n    open(p, m).write('pwned')\n    print('WROTE', p)\n"
      "  except OSError as e:\n    print('blocked', type(e).__name__)\n"
    )
    r = sandbox.run_python(code, isolation_level=level)
    assert r.ok and "WROTE" not in r.stdout and r.stdout.count("blocked") == 2, r.stdout
    assert pathlib.Path(canary).read_text() == "intact" and os.listdir(outside) == ["canary.txt"]
  finally:
    for name in os.listdir(outside):
      os.remove(os.path.join(outside, name))
    os.rmdir(outside)


def test_network_is_unreachable(level):
  server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
  server.bind(("127.0.0.1", 0))
  server.listen(4)
  server.setblocking(False)
  port = server.getsockname()[1]
  code = (
    "import socket\ntry:\n"
    f"  socket.create_connection(('127.0.0.1', {port}), timeout=1).sendall(b'hi')\n"
    "  print('CONNECTED')\nexcept OSError as e:\n  print('blocked', type(e).__name__)\n"
  )
  try:
    r = sandbox.run_python(code, isolation_level=level)
    assert r.ok and r.stdout.startswith("blocked"), (r.stdout, r.stderr)
    with pytest.raises(BlockingIOError):
      server.accept()  # nothing reached the host's loopback listener
  finally:
    server.close()


def test_signals_cannot_reach_host_processes(level):
  received = []
  old = signal.signal(signal.SIGUSR2, lambda *_: received.append(1))
  victim = subprocess.Popen(["sleep", "30"])
  try:
    code = (
      "import os, signal\n"
      f"for pid, sig in [(os.getppid(), signal.SIGUSR2), ({os.getpid()}, signal.SIGUSR2),"
      f" ({victim.pid}, signal.SIGKILL)]:\n"
      "  try:\n    os.kill(pid, sig)\n    print('sent', pid)\n"
      "  except OSError as e:\n    print('blocked', type(e).__name__)\n"
    )
    r = sandbox.run_python(code, isolation_level=level)
    time.sleep(0.2)
    assert not received, r.stdout
    assert victim.poll() is None, r.stdout
  finally:
    victim.kill()
    victim.wait()
    signal.signal(signal.SIGUSR2, old)


def test_parent_environment_is_invisible(level, monkeypatch):
  monkeypatch.setenv("SAO_TEST_SECRET", "hunter2-canary")
  code = (
    "import os\nprint(sorted(os.environ))\n"
    f"for pid in [os.getppid(), {os.getpid()}]:\n"
    "  try:\n    print(open(f'/proc/{pid}/environ', 'rb').read())\n"
    "  except OSError as e:\n    print('blocked', type(e).__name__)\n"
  )
  r = sandbox.run_python(code, isolation_level=level)
  assert r.ok, r.stderr
  assert "hunter2" not in r.stdout + r.stderr and "SAO_TEST_SECRET" not in r.stdout


def test_sixteen_concurrent_runs(level):
  def job(i):
    return sandbox.run_python(
      f"import time\ntime.sleep(0.2)\nprint({i} * {i})", isolation_level=level
    )

  start = time.monotonic()
  with concurrent.futures.ThreadPoolExecutor(16) as pool:
    results = list(pool.map(job, range(16)))
  assert [r.stdout for r in results] == [f"{i * i}\n" for i in range(16)]
  assert time.monotonic() - start < 10.0


def test_paths_under_private_mounts_are_bound_back():
  # A clone in /tmp/x with its .venv: the private /tmp tmpfs would hide the interpreter.
  base = pathlib.Path(tempfile.mkdtemp(dir="/tmp"))
  try:
    (base / "repo" / ".venv" / "lib").mkdir(parents=True)
    repo, venv = str(base / "repo"), str(base / "repo" / ".venv")
    args = sandbox._rebind_hidden([venv, repo, "/usr", str(base / "missing")])
    pairs = [tuple(args[i : i + 3]) for i in range(len(args) - 2)]
    assert ("--ro-bind", repo, repo) in pairs
    assert args.count("--ro-bind") == 1 and "/usr" not in args  # .venv: inside repo, bound once
    assert args[: args.index("--ro-bind")] == ["--perms", "0755", "--dir", str(base)]
  finally:
    subprocess.run(["rm", "-rf", str(base)], check=True)
