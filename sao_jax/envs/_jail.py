"""In-sandbox launcher: drops privileges, applies limits and filters, then runs the tool code.

Run by `sandbox.py` as `python -I -S _jail.py SPEC` inside the sandbox (bubblewrap) or directly
(the rlimit fallback). It imports only the standard library, so it starts fast and works in any
interpreter. It runs in the child, never in the caller, so the caller stays thread-safe (no
`preexec_fn`).

SPEC is a dict, marshalled and hex-encoded (json would import `re`: 20 ms of start-up). Keys:
  mode: 'python' (exec the file `code_file` in this interpreter as __main__) or 'exec' (execvp
    `argv`).
  uid: switch to this uid/gid before anything else (root callers), or null.
  limits: {cpu_s, as_bytes, fsize_bytes, nofile, nproc}; null entries are left alone.
  seccomp: {block_socket, block_fork, block_setsid} booleans (used by the fallback).
  site_dirs: package directories appended to sys.path (the launcher starts with -S for speed).
  landlock_dir: restrict writes to this directory, TCP and signals to the sandbox (fallback), or
    null.
"""

import marshal
import os
import sys

_LIBC = None  # loaded only when a filter is installed (ctypes costs ~5 ms of start-up)


def _libc():
  global _LIBC, ctypes, struct
  if _LIBC is None:
    import ctypes
    import struct

    _LIBC = ctypes.CDLL(None, use_errno=True)
    _LIBC.syscall.restype = ctypes.c_long
    _LIBC.prctl.restype = ctypes.c_int
  return _LIBC


# ---------------------------------------------------------------------------------------- seccomp
# Syscall numbers per audit arch: socket, clone, clone3, setsid, setpgid, fork, vfork.
_ARCH = {
  0xC000003E: dict(socket=41, clone=56, clone3=435, setsid=112, setpgid=109, fork=57, vfork=58),
  0xC00000B7: dict(socket=198, clone=220, clone3=435, setsid=157, setpgid=154),
}
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_CLONE_THREAD = 0x00010000
_EACCES, _EAGAIN, _ENOSYS, _EPERM = 13, 11, 38, 1


def _stmt(code, k):
  return (code, 0, 0, k)


def _jeq(k, jt, jf=0):
  return (0x15, jt, jf, k)  # BPF_JMP | BPF_JEQ | BPF_K


def _seccomp_program(nrs, *, block_socket, block_fork, block_setsid):
  """A classic-BPF filter: returns errno for the blocked syscalls, allows everything else."""
  deny = []  # (syscall number, errno)
  if block_socket:
    deny.append((nrs["socket"], _EACCES))
  if block_setsid:
    deny += [(nrs["setsid"], _EPERM), (nrs["setpgid"], _EPERM)]
  if block_fork:
    deny += [(nrs[n], _EAGAIN) for n in ("fork", "vfork") if n in nrs]
    deny.append((nrs["clone3"], _ENOSYS))  # glibc falls back to clone(), which we can inspect
  prog = [_stmt(0x20, 0)]  # ld [nr]
  for nr, errno in deny:
    prog += [_jeq(nr, 0, 1), _stmt(0x06, _RET_ERRNO | errno)]
  if block_fork:  # clone without CLONE_THREAD creates a process; threads stay allowed
    prog += [_jeq(nrs["clone"], 0, 3), _stmt(0x20, 16), (0x45, 1, 0, _CLONE_THREAD)]
    prog += [_stmt(0x06, _RET_ERRNO | _EAGAIN)]
  prog.append(_stmt(0x06, _RET_ALLOW))
  return prog


def _install_seccomp(flags):
  arch = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}.get(os.uname().machine)
  if arch is None or not any(flags.values()):
    return
  libc = _libc()
  prog = [_stmt(0x20, 4), _jeq(arch, 1, 0), _stmt(0x06, _RET_ALLOW)]  # other arch: allow
  prog += _seccomp_program(_ARCH[arch], **flags)
  raw = b"".join(struct.pack("HBBI", *ins) for ins in prog)
  buf = ctypes.create_string_buffer(raw)
  fprog = struct.pack("HxxxxxxQ", len(prog), ctypes.addressof(buf))
  fprog_buf = ctypes.create_string_buffer(fprog)
  if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
    raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
  if (
    libc.prctl(22, 2, ctypes.c_void_p(ctypes.addressof(fprog_buf)), 0, 0) != 0
  ):  # PR_SET_SECCOMP, FILTER
    raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")


# --------------------------------------------------------------------------------------- landlock
# Write-type filesystem rights (ABI 1): write_file, remove_dir/file, make_char/dir/reg/sock/fifo/
# block/sym; plus refer (ABI 2) and truncate (ABI 3).
_FS_WRITE_V1 = (1 << 1) | sum(1 << i for i in range(4, 13))
_FS_REFER, _FS_TRUNCATE = 1 << 13, 1 << 14
_NET_TCP = 0b11  # bind_tcp | connect_tcp (ABI 4)
_SCOPE = 0b11  # abstract unix sockets | signals (ABI 6)


def _install_landlock(write_dir):
  """Denies writes outside `write_dir` (and /dev), TCP, and signals leaving the sandbox."""
  libc = _libc()
  abi = libc.syscall(444, None, 0, 1)  # landlock_create_ruleset(NULL, 0, VERSION)
  if abi < 1:
    return 0
  fs = _FS_WRITE_V1 | (_FS_REFER if abi >= 2 else 0) | (_FS_TRUNCATE if abi >= 3 else 0)
  attr = struct.pack("Q", fs)
  if abi >= 4:
    attr += struct.pack("Q", _NET_TCP)
  if abi >= 6:
    attr += struct.pack("Q", _SCOPE)
  ruleset = libc.syscall(444, attr, len(attr), 0)
  if ruleset < 0:
    raise OSError(ctypes.get_errno(), "landlock_create_ruleset")
  for path, rights in ((write_dir, fs), ("/dev", 1 << 1)):
    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    rule = struct.pack("=Qi", rights, fd)
    if libc.syscall(445, ruleset, 1, rule, 0) != 0:  # LANDLOCK_RULE_PATH_BENEATH
      raise OSError(ctypes.get_errno(), f"landlock_add_rule({path})")
    os.close(fd)
  if libc.prctl(38, 1, 0, 0, 0) != 0 or libc.syscall(446, ruleset, 0) != 0:
    raise OSError(ctypes.get_errno(), "landlock_restrict_self")
  os.close(ruleset)
  return abi


# ------------------------------------------------------------------------------------------- main
def _apply_limits(limits):
  import resource

  names = dict(
    cpu_s=resource.RLIMIT_CPU,
    as_bytes=resource.RLIMIT_AS,
    fsize_bytes=resource.RLIMIT_FSIZE,
    nofile=resource.RLIMIT_NOFILE,
    nproc=resource.RLIMIT_NPROC,
  )
  resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
  for key, value in limits.items():
    if value is not None:
      hard = value + 1 if key == "cpu_s" else value  # SIGXCPU at soft, SIGKILL at hard
      resource.setrlimit(names[key], (value, hard))


def _run_python(code_file):
  """Runs `code_file` as __main__ with a traceback that shows only the user's frames."""
  with open(code_file, encoding="utf-8") as f:
    source = f.read()
  sys.argv = [code_file]
  sys.path[:0] = [os.getcwd()]
  main = {"__name__": "__main__", "__file__": code_file, "__builtins__": __builtins__}
  try:
    exec(compile(source, code_file, "exec"), main)
  except SystemExit:
    raise
  except BaseException as e:
    import traceback

    tb = e.__traceback__.tb_next if e.__traceback__ else None
    traceback.print_exception(type(e), e, tb, file=sys.stderr)
    sys.stderr.flush()
    os._exit(1)


def main():
  """Applies the SPEC in argv[1] to this process, then runs the tool code."""
  spec = marshal.loads(bytes.fromhex(sys.argv[1]))
  sys.path += spec.get("site_dirs", [])  # started with -S: packages without .pth processing
  if spec.get("uid") is not None:
    uid = spec["uid"]
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
  _apply_limits(spec.get("limits") or {})
  if spec.get("landlock_dir"):
    _install_landlock(spec["landlock_dir"])
  _install_seccomp(spec.get("seccomp") or {})
  if spec["mode"] == "python":
    _run_python(spec["code_file"])
  else:
    argv = spec["argv"]
    try:
      os.execvp(argv[0], argv)
    except OSError as e:
      print(f"sandbox: cannot run {argv[0]!r}: {e.strerror}", file=sys.stderr)
      os._exit(127)


if __name__ == "__main__":
  main()
