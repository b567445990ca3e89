"""The program that runs inside a sandbox (`sandbox/local.py` starts it with `python -I -c <this file>`): it reads
one JSON job from stdin, isolates itself further, runs the job's cases one by one, and prints one JSON line per
case to stdout as each finishes. Standard library only; nothing here trusts the code it runs.

The job (`marshal`ed by the orchestrator): {"level", "slot_uid", "workdir", "paths" (added to sys.path: the
harness starts without `site`, which is slow), "scratch" (where `unshare` mounts tmpfs), "solution", "cases",
"limits"}; a call case's "args" is the list of
arguments itself.

1. Isolation it finishes itself:
   - `unshare` level (started by util-linux `unshare` in new user, mount, PID, network, IPC and UTS namespaces):
     every mount becomes read-only (`mount_setattr(AT_RECURSIVE, MOUNT_ATTR_RDONLY)`), then fresh size-capped
     tmpfs mounts cover /tmp, /var/tmp and /dev/shm (each that holds none of Python's own files);
   - as real root (`bwrap` or `unshare` levels started by root): the harness switches to the job's unprivileged
     `slot_uid` (no capabilities left; the process limit counts per uid, and root is exempt from it);
   - otherwise (a namespace's mapped root): the capability bounding set is emptied, so no case keeps a capability;
   - no new privileges, and the harness is not dumpable (a case cannot read its memory or its file descriptors).
2. The solution is compiled once (a SyntaxError: every case is a `compile_error`). Each case runs in a child forked
   from this process, in its own process group, with the limits as rlimits (CPU, address space, processes, file
   size, open files, no core), stdin from a file, stdout to a pipe read up to `output_bytes` (more: the case is
   killed, `output_limit`), stderr's tail kept, and the case's wall-clock limit. A case is:
   - `stdio`: the solution as `__main__` with the case's stdin; its stdout is the result;
   - `call`: the solution as a module named `solution` (its `if __name__ == "__main__"` block does not run), then
     `fn(*args)` (a top-level function, or a method of `Solution()`); the result, as JSON, is written to a separate
     pipe (what the solution prints does not count);
   - `assert`: the solution, then the case's test code, in one namespace; passing means the test code ran to its
     end (a solution that exits early does not pass).
   Comparing the result with the expected one happens outside, in the orchestrator: expected outputs never enter
   the sandbox.
3. After each case, in a PID namespace, every process the case left behind is killed (`kill(-1, SIGKILL)`, which
   spares only the caller and the namespace's init).

One output line per case: {"status": "ok"|"error"|"timeout"|"output_limit"|"compile_error", "exit_code", "stdout",
"stderr", "result", "seconds"}.
"""

import _json
import builtins
import ctypes
import marshal
import os
import resource
import selectors
import signal
import sys
import time

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REC, MS_PRIVATE = 1, 2, 4, 16384, 1 << 18
MOUNT_ATTR_RDONLY, AT_RECURSIVE, AT_FDCWD, SYS_MOUNT_SETATTR = 1, 0x8000, -100, 442
PR_SET_DUMPABLE, PR_SET_KEEPCAPS, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 4, 8, 24, 38
CAP_DAC_READ_SEARCH, LINUX_CAPABILITY_VERSION_3 = 2, 0x20080522
STDERR_TAIL = 4096

libc = ctypes.CDLL(None, use_errno=True)


def check(result, what):
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def read_only_filesystem(tmp_bytes, scratch):
    """Every mount read-only, then writable size-capped tmpfs over the `scratch` directories."""
    check(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "make mounts private")

    class MountAttr(ctypes.Structure):
        _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                    ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]

    attr = MountAttr(MOUNT_ATTR_RDONLY, 0, 0, 0)
    check(libc.syscall(SYS_MOUNT_SETATTR, AT_FDCWD, b"/", AT_RECURSIVE, ctypes.byref(attr), ctypes.sizeof(attr)),
          "make mounts read-only")
    for path in scratch:
        if os.path.isdir(path):
            options = f"size={tmp_bytes},mode=1777".encode()
            check(libc.mount(b"tmpfs", path.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, options), f"mount {path}")


def drop_privileges(slot_uid, keep_read_search):
    """Root (the host's) becomes `slot_uid` (keeping only CAP_DAC_READ_SEARCH when `keep_read_search`: the
    `unshare` level's read-only view of a host whose Python may sit in a directory only root can enter); a
    namespace's root loses its capabilities at the next exec."""
    if os.getuid() == 0 and slot_uid is not None and not in_user_namespace():
        keep = 1 << CAP_DAC_READ_SEARCH if keep_read_search else 0
        for cap in range(64):
            if not keep >> cap & 1:
                libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
        check(libc.prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0), "keep capabilities")
        os.setgroups([])
        os.setgid(slot_uid)
        os.setuid(slot_uid)
        set_capabilities(keep)
    else:
        for cap in range(64):
            libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no new privileges")
    check(libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "not dumpable")


def set_capabilities(mask):
    """Effective and permitted capabilities exactly `mask` (of the first 32), none inheritable."""

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    data = (Data * 2)(Data(mask, mask, 0), Data(0, 0, 0))
    check(libc.capset(ctypes.byref(Header(LINUX_CAPABILITY_VERSION_3, 0)), data), "set capabilities")


def in_user_namespace():
    with open("/proc/self/uid_map") as f:
        return f.read().split() != ["0", "0", "4294967295"]


def set_limits(limits):
    for name, value in (("RLIMIT_CPU", limits["cpu_s"]), ("RLIMIT_AS", limits["memory_bytes"]),
                        ("RLIMIT_NPROC", limits["processes"]), ("RLIMIT_FSIZE", limits["file_bytes"]),
                        ("RLIMIT_NOFILE", limits["open_files"]), ("RLIMIT_CORE", 0)):
        resource.setrlimit(getattr(resource, name), (value, value))


def run_in_child(code, case, stdin_path, out_w, result_w, err_w, limits):
    """The forked child: redirect, limit, run. Never returns."""
    try:
        os.setpgid(0, 0)
        fd = os.open(stdin_path, os.O_RDONLY)
        os.dup2(fd, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        os.dup2(result_w, 3)
        os.closerange(4, 1 << 16)
        sys.stdin = open(0, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115 - the case's own
        sys.stdout = open(1, "w", encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
        set_limits(limits)
        name = "__main__" if case["kind"] == "stdio" else "solution"  # a call or assert case skips the main block
        namespace = {"__name__": name, "__file__": "solution.py", "__builtins__": __builtins__}
        exec(code, namespace)
        with open(3, "w", encoding="utf-8", closefd=False) as result:
            if case["kind"] == "call":
                fn = namespace.get(case["fn"])
                if fn is None and isinstance(namespace.get("Solution"), type):
                    fn = getattr(namespace["Solution"](), case["fn"])
                if fn is None:
                    raise NameError(f"the solution defines no function {case['fn']!r}")
                result.write(dumps(fn(*case["args"])))
            elif case["kind"] == "assert":
                exec(compile(case["code"], "tests.py", "exec"), namespace)
                result.write("true")
        sys.stdout.flush()
        os._exit(0)
    except SystemExit as exc:
        code_ = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        flush_quietly()
        os._exit(code_ if case["kind"] == "stdio" else (code_ or 1))
    except BaseException:  # noqa: BLE001 - any error of the solution is the case's error
        try:
            import traceback  # only on an error: the start of every sandbox stays cheap

            traceback.print_exc()
        except BaseException:  # noqa: BLE001
            pass
        flush_quietly()
        os._exit(1)


def flush_quietly():
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001
            pass


def _beyond_json(value):
    """What JSON has no form for: a set as its sorted list (as given when unsortable), anything else as its repr."""
    if isinstance(value, (set, frozenset)):
        try:
            return sorted(value)
        except TypeError:
            return list(value)
    return repr(value)


_ENCODE = _json.make_encoder(None, _beyond_json, _json.encode_basestring_ascii, None, ": ", ", ", False, True, True)


def dumps(value):
    """JSON text of `value` with the C encoder the `json` package wraps (importing `json` itself costs each sandbox
    ~10 ms: it loads `re`); tuples are lists, dict keys that are not strings are skipped."""
    return "".join(_ENCODE(value, 0))


def run_case(code, case, index, job):
    limits = job["limits"]
    stdin_path = os.path.join(job["workdir"], f"case_{index}.in")
    with open(stdin_path, "w", encoding="utf-8") as f:
        f.write(case.get("stdin", ""))
    pipes = [os.pipe() for _ in range(3)]  # stdout, result, stderr
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        run_in_child(code, case, stdin_path, pipes[0][1], pipes[1][1], pipes[2][1], limits)
    for _, w in pipes:
        os.close(w)
    caps = {pipes[0][0]: limits["output_bytes"], pipes[1][0]: limits["output_bytes"], pipes[2][0]: 1 << 20}
    data = {r: bytearray() for r, _ in pipes}
    status, wait_status = None, None
    with selectors.DefaultSelector() as sel:
        for r, _ in pipes:
            sel.register(r, selectors.EVENT_READ)
        deadline = start + limits["wall_s"]
        while sel.get_map() and status is None:
            left = deadline - time.monotonic()
            if left <= 0:
                status = "timeout"
                break
            ready = sel.select(min(left, 0.05))
            for key, _ in ready:
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fd)
                    continue
                data[key.fd] += chunk
                if len(data[key.fd]) > caps[key.fd]:
                    if key.fd == pipes[2][0]:
                        del data[key.fd][:-STDERR_TAIL]
                    else:
                        status = "output_limit"
            if not ready and wait_status is None:  # pipes still open: a process the case left may hold them
                done, found = os.waitpid(pid, os.WNOHANG)
                if done:
                    wait_status = found
                    break
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
    if wait_status is None:
        _, wait_status = os.waitpid(pid, 0)
    kill_leftovers(job)
    seconds = time.monotonic() - start
    for r, _ in pipes:
        os.close(r)
    exit_code = os.waitstatus_to_exitcode(wait_status)
    if status is None:
        killed_by_cpu = exit_code in (-signal.SIGXCPU, -signal.SIGKILL)
        status = "timeout" if killed_by_cpu else ("ok" if exit_code == 0 else "error")
    out = bytes(data[pipes[0][0]][:limits["output_bytes"]]).decode("utf-8", "replace")
    result = bytes(data[pipes[1][0]][:limits["output_bytes"]]).decode("utf-8", "replace")
    err = bytes(data[pipes[2][0]][-STDERR_TAIL:]).decode("utf-8", "replace")
    os.unlink(stdin_path)
    return {"status": status, "exit_code": exit_code, "stdout": out, "result": result, "stderr": err,
            "seconds": round(seconds, 4)}


def kill_leftovers(job):
    """In a PID namespace, whose init this harness is: every process a case left behind (in its own group or
    session too) is killed and reaped, so the next case starts alone. Never outside a namespace."""
    if job["level"] == "none" or os.getpid() != 1:
        return
    try:
        os.kill(-1, signal.SIGKILL)
    except OSError:
        pass
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            break


def main():
    job = marshal.loads(sys.stdin.buffer.read())  # from the orchestrator, which is trusted (results go back as JSON)
    sys.path.extend(job["paths"])  # started with -S (no site: faster); the packages a solution may import
    builtins.exit = builtins.quit = sys.exit
    if job["level"] == "unshare":
        read_only_filesystem(job["limits"]["tmp_bytes"], job["scratch"])
    if job["level"] != "none":
        drop_privileges(job.get("slot_uid"), keep_read_search=job["level"] == "unshare")
        os.makedirs(job["workdir"], exist_ok=True)
    os.chdir(job["workdir"])
    out = sys.stdout
    try:
        code = compile(job["solution"], "solution.py", "exec")
    except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
        line = {"status": "compile_error", "exit_code": None, "stdout": "", "result": "",
                "stderr": f"{type(exc).__name__}: {exc}"[-STDERR_TAIL:], "seconds": 0.0}
        for _ in job["cases"]:
            out.write(dumps(line) + "\n")
        out.flush()
        return
    for index, case in enumerate(job["cases"]):
        out.write(dumps(run_case(code, case, index, job)) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
