#!/usr/bin/env python3
"""Self-test of the cell's seccomp profile (sandbox-image/seccomp.json).

Run on the host (needs Docker and the cell image, see `make image`):

    python3 sandbox-image/seccomp-selftest.py [--image cellblock-cell:dev]
                                              [--seccomp sandbox-image/seccomp.json]

The host side starts a plain AF_UNIX echo server and (when grpcio is importable on the
host) a gRPC server on unix sockets in a temporary directory, then starts one cell with
the production flags (read-only root, no network, no capabilities, no-new-privileges,
uid 65532, pids/memory limits, the profile) with that directory as its only mount, and
runs this same file inside it with --inside. The inside part checks that what the guest
agent needs works and that what the profile removes fails with EPERM, and prints one JSON
line per check. The host prints a summary and exits 0 only when every check passed.

Pass --seccomp default to run the same checks under Docker's default profile: then the
"denied" checks that only this profile adds are expected to FAIL (a control run).

The inside part uses only the standard library plus quickjs_rs and grpc from the image.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

EPERM = 1
MOUNT_POINT = "/run/cellblock"
SCRIPT_IN_CELL = "/selftest/seccomp-selftest.py"
ECHO_METHOD = "/cellblock.selftest.Echo/Echo"

# Syscall numbers for calls that libc has no wrapper for (or that we call raw).
SYSCALLS = {
    "x86_64": {"keyctl": 250, "add_key": 248, "bpf": 321, "perf_event_open": 298,
               "userfaultfd": 323, "io_uring_setup": 425, "pivot_root": 155,
               "kexec_load": 246, "init_module": 175, "process_vm_readv": 310},
    "aarch64": {"keyctl": 219, "add_key": 217, "bpf": 280, "perf_event_open": 241,
                "userfaultfd": 282, "io_uring_setup": 425, "pivot_root": 41,
                "kexec_load": 104, "init_module": 105, "process_vm_readv": 270},
}


# --------------------------------------------------------------------------- inside the cell

def _inside(sock_dir: str) -> int:
    import ctypes

    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    nr = SYSCALLS[platform.machine()]
    results: list[dict[str, Any]] = []

    def check(kind: str, name: str, fn: Callable[[], str]) -> None:
        try:
            detail = fn()
            ok = True
        except Exception as exc:  # every failure is reported, none aborts the run
            detail = f"{type(exc).__name__}: {exc}"
            ok = False
        line = {"kind": kind, "check": name, "ok": ok, "detail": detail}
        results.append(line)
        print(json.dumps(line), flush=True)

    def expect_eperm(rc: int, what: str) -> str:
        err = ctypes.get_errno()
        if rc != -1:
            raise AssertionError(f"{what} succeeded (rc={rc})")
        if err != EPERM:
            raise AssertionError(f"{what} failed with {os.strerror(err)} (errno {err}), not EPERM")
        return "EPERM"

    def raw(name: str, *args: int) -> int:
        ctypes.set_errno(0)
        return int(libc.syscall(ctypes.c_long(nr[name]), *[ctypes.c_long(a) for a in args]))

    # ---- the environment is the locked-down one
    def environment() -> str:
        status = dict(
            line.split(":\t", 1) for line in Path("/proc/self/status").read_text().splitlines()
            if ":\t" in line
        )
        facts: dict[str, Any] = {
            "uid": os.getuid(), "gid": os.getgid(),
            "Seccomp": status.get("Seccomp", "?").strip(),
            "NoNewPrivs": status.get("NoNewPrivs", "?").strip(),
            "CapEff": status.get("CapEff", "?").strip(),
        }
        assert facts["uid"] == 65532 and facts["gid"] == 65532, facts
        assert facts["Seccomp"] == "2", facts  # 2 = filter mode
        assert facts["NoNewPrivs"] == "1", facts
        assert int(facts["CapEff"], 16) == 0, facts
        try:
            Path("/opt/cellblock/probe").write_text("x")
        except OSError as exc:
            assert exc.errno == 30, exc  # EROFS: the root is read-only
        else:
            raise AssertionError("the root file system is writable")
        return json.dumps(facts)

    # ---- what the guest agent needs
    def imports() -> str:
        import google.protobuf
        import grpc
        import quickjs_rs  # noqa: F401
        return f"grpc {grpc.__version__}, protobuf {google.protobuf.__version__}"

    def quickjs_eval() -> str:
        import quickjs_rs

        with quickjs_rs.Runtime(memory_limit=32 << 20) as rt, rt.new_context(timeout=2.0) as ctx:
            ctx.register("hostAdd", lambda a, b: a + b)
            value = ctx.eval(
                "const xs = [3, 1, 2].sort(); "
                "JSON.stringify({xs, re: /b+/.exec('abbbc')[0], sum: hostAdd(20, 22)})"
            )
            assert json.loads(value) == {"xs": [1, 2, 3], "re": "bbb", "sum": 42}, value
            payload = ctx.create_snapshot().to_bytes()
        with quickjs_rs.Runtime() as rt2, rt2.new_context() as ctx2:
            rt2.restore_snapshot(quickjs_rs.Snapshot.from_bytes(payload), ctx2)
            assert ctx2.eval("xs.length") == 3
        return f"eval + host callback + snapshot round trip ({len(payload)} bytes)"

    def quickjs_limits() -> str:
        import quickjs_rs

        with quickjs_rs.Runtime() as rt, rt.new_context(timeout=0.3) as ctx:
            try:
                ctx.eval("for (;;) {}")
            except quickjs_rs.TimeoutError:
                pass
            else:
                raise AssertionError("endless loop was not interrupted")
        with quickjs_rs.Runtime() as rt, rt.new_context() as ctx:
            # quickjs-rs 0.2.6 surfaces this as wasmtime.Trap ("call stack exhausted"):
            # wasmtime's SIGSEGV/SIGILL trap handling must work under the profile.
            try:
                ctx.eval("(function f() { return f() + 1; })()")
            except Exception as exc:
                recursion = f"{type(exc).__module__}.{type(exc).__name__}"
            else:
                raise AssertionError("runaway recursion was not stopped")
        with quickjs_rs.Runtime(memory_limit=8 << 20) as rt, rt.new_context() as ctx:
            try:
                ctx.eval("const a = []; for (let i = 0; ; i++) a.push({i, s: 'y' + i});")
            except Exception as exc:
                memory = f"{type(exc).__module__}.{type(exc).__name__}"
            else:
                raise AssertionError("memory limit was not enforced")
        return f"interrupt ok, recursion -> {recursion}, memory limit -> {memory}"

    def threads() -> str:
        import quickjs_rs

        out: list[Any] = []

        def work() -> None:
            with quickjs_rs.Runtime() as rt, rt.new_context() as ctx:
                out.append(ctx.eval("6 * 7"))

        workers = [threading.Thread(target=work) for _ in range(4)]
        for t in workers:
            t.start()
        for t in workers:
            t.join(10)
        assert out == [42] * 4, out
        return "4 threads, one QuickJS VM each"

    def unix_sockets() -> str:
        a, b = socket.socketpair()
        with a, b:
            a.sendall(b"ping")
            assert b.recv(4) == b"ping"
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(5)
            s.connect(os.path.join(sock_dir, "echo.sock"))
            s.sendall(b"hello bridge\n")
            reply = s.makefile("rb").readline()
        assert reply == b"hello bridge\n", reply
        return "socketpair + connect to the host's echo socket"

    def grpc_unix() -> str:
        import grpc

        path = os.path.join(sock_dir, "grpc.sock")
        if not os.path.exists(path):
            return "skipped: the host has no grpcio, so no gRPC server was started"
        with grpc.insecure_channel(f"unix:{path}") as channel:
            echo = channel.unary_unary(ECHO_METHOD)
            reply = echo(b"attach", timeout=10)
        assert reply == b"attach", reply

        async def aio_call() -> bytes:  # the guest agent uses grpc.aio on asyncio
            async with grpc.aio.insecure_channel(f"unix:{path}") as channel:
                reply: bytes = await channel.unary_unary(ECHO_METHOD)(b"attach-aio", timeout=10)
                return reply

        import asyncio
        reply = asyncio.run(aio_call())
        assert reply == b"attach-aio", reply
        return "unary calls (grpc and grpc.aio on asyncio) to the host's gRPC server over unix:"

    # ---- what the profile removes
    def af(family: int, kind: int = socket.SOCK_STREAM) -> Callable[[], str]:
        def run() -> str:
            try:
                socket.socket(family, kind).close()
            except PermissionError:
                return "EPERM"
            raise AssertionError(f"socket({family}) succeeded")
        return run

    def bind_unix() -> str:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            try:
                s.bind("\0cellblock-selftest")
            except PermissionError:
                return "EPERM"
        raise AssertionError("bind succeeded")

    def unshare(flag: int) -> Callable[[], str]:
        return lambda: expect_eperm((ctypes.set_errno(0), libc.unshare(flag))[1], "unshare")

    def setns() -> str:
        ctypes.set_errno(0)
        return expect_eperm(libc.setns(-1, 0), "setns")  # EBADF if the call were allowed

    def ptrace() -> str:
        ctypes.set_errno(0)
        return expect_eperm(libc.ptrace(0, 0, None, None), "ptrace(PTRACE_TRACEME)")

    def fork() -> str:
        try:
            pid = os.fork()
        except PermissionError:
            return "EPERM"
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        raise AssertionError("fork succeeded")

    def subprocess_spawn() -> str:
        try:
            subprocess.run(["/bin/true"], check=False)
        except PermissionError:
            return "EPERM"
        raise AssertionError("spawning /bin/true succeeded")

    def personality() -> str:
        libc.personality.argtypes = [ctypes.c_ulong]
        ctypes.set_errno(0)
        current = libc.personality(0xFFFFFFFF)  # query: allowed
        assert current != -1, os.strerror(ctypes.get_errno())
        ctypes.set_errno(0)
        return expect_eperm(libc.personality(0x0008), "personality(PER_LINUX32)")

    def ioctl_tiocsti() -> str:
        fd = os.open("/dev/null", os.O_RDONLY)
        try:
            ctypes.set_errno(0)
            return expect_eperm(libc.ioctl(fd, 0x5412, ctypes.c_char_p(b"x")), "ioctl(TIOCSTI)")
        finally:
            os.close(fd)

    def mount() -> str:
        ctypes.set_errno(0)
        return expect_eperm(libc.mount(b"none", b"/tmp", b"tmpfs", 0, None), "mount")

    def chroot() -> str:
        ctypes.set_errno(0)
        return expect_eperm(libc.chroot(b"/"), "chroot")

    # Raw syscalls with NULL/invalid arguments: allowed they would fail with EFAULT,
    # EINVAL or EBADF; filtered they fail with EPERM before the kernel looks at them.
    raw_denied: dict[str, tuple[Any, ...]] = {
        "keyctl": ("keyctl", 0, -3, 0),  # KEYCTL_GET_KEYRING_ID(session): works unfiltered
        "add_key": ("add_key", 0, 0, 0, 0, 0),
        "bpf": ("bpf", 0, 0, 0),
        "perf_event_open": ("perf_event_open", 0, 0, -1, -1, 0),
        "userfaultfd": ("userfaultfd", 0),
        "io_uring_setup": ("io_uring_setup", 1, 0),
        "pivot_root": ("pivot_root", 0, 0),
        "kexec_load": ("kexec_load", 0, 0, 0, 0),
        "init_module": ("init_module", 0, 0, 0),
        "process_vm_readv": ("process_vm_readv", 1, 0, 0, 0, 0, 0),
    }

    check("env", "locked-down environment", environment)
    check("allowed", "import quickjs_rs, grpc, google.protobuf", imports)
    check("allowed", "QuickJS eval, host callback, snapshot", quickjs_eval)
    check("allowed", "QuickJS interrupt, recursion and memory traps", quickjs_limits)
    check("allowed", "threads", threads)
    check("allowed", "AF_UNIX sockets", unix_sockets)
    check("allowed", "gRPC over a unix socket", grpc_unix)
    check("denied", "socket(AF_INET)", af(socket.AF_INET))
    check("denied", "socket(AF_INET6)", af(socket.AF_INET6))
    check("denied", "socket(AF_INET, SOCK_DGRAM)", af(socket.AF_INET, socket.SOCK_DGRAM))
    check("denied", "socket(AF_NETLINK)", af(socket.AF_NETLINK, socket.SOCK_RAW))
    check("denied", "socket(AF_PACKET)", af(socket.AF_PACKET, socket.SOCK_RAW))
    check("denied", "bind(AF_UNIX)", bind_unix)
    check("denied", "unshare(CLONE_NEWUSER)", unshare(0x10000000))
    check("denied", "unshare(CLONE_NEWNS)", unshare(0x00020000))
    check("denied", "setns", setns)
    check("denied", "fork", fork)
    check("denied", "subprocess", subprocess_spawn)
    check("denied", "personality(PER_LINUX32)", personality)
    check("denied", "ioctl(TIOCSTI)", ioctl_tiocsti)
    check("denied", "mount", mount)
    check("denied", "chroot", chroot)
    def raw_denied_check(name: str, args: tuple[int, ...]) -> Callable[[], str]:
        return lambda: expect_eperm(raw(name, *args), name)

    for label, (name, *args) in raw_denied.items():
        check("denied", label, raw_denied_check(name, tuple(args)))
    # Last: were it allowed, PTRACE_TRACEME would leave this process traced by its parent.
    check("denied", "ptrace(PTRACE_TRACEME)", ptrace)
    return 0 if all(r["ok"] for r in results) else 1


# --------------------------------------------------------------------------- on the host

def _echo_server(path: str) -> socket.socket:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    os.chmod(path, 0o666)
    server.listen(8)

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                data = conn.makefile("rb").readline()
                conn.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    return server


def _grpc_server(path: str) -> Any:
    try:
        import grpc
    except ImportError:
        return None
    handler = grpc.method_handlers_generic_handler(
        ECHO_METHOD.split("/")[1],
        {ECHO_METHOD.split("/")[2]: grpc.unary_unary_rpc_method_handler(lambda req, ctx: req)},
    )
    server = grpc.server(thread_pool=__import__("concurrent.futures").futures.ThreadPoolExecutor(2))
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"unix:{path}")
    server.start()
    os.chmod(path, 0o666)
    return server


def _host(image: str, seccomp: str, timeout: float) -> int:
    if shutil.which("docker") is None:
        print("seccomp-selftest: no docker client on PATH", file=sys.stderr)
        return 2
    if seccomp != "default":
        seccomp = str(Path(seccomp).resolve())
        json.loads(Path(seccomp).read_text())  # fail early on a broken profile
    here = Path(__file__).resolve()
    with tempfile.TemporaryDirectory(prefix="cellblock-selftest-") as sock_dir:
        os.chmod(sock_dir, 0o711)
        echo = _echo_server(os.path.join(sock_dir, "echo.sock"))
        grpc_server = _grpc_server(os.path.join(sock_dir, "grpc.sock"))
        cmd = [
            "docker", "run", "--rm", "--read-only", "--network", "none", "--cap-drop", "ALL",
            "--security-opt", "no-new-privileges",
            *([] if seccomp == "default" else ["--security-opt", f"seccomp={seccomp}"]),
            "--user", "65532:65532", "--pids-limit", "64",
            "--memory", "256m", "--memory-swap", "256m", "--ipc", "private",
            "-v", f"{sock_dir}:{MOUNT_POINT}",
            "-v", f"{here.parent}:{os.path.dirname(SCRIPT_IN_CELL)}:ro",
            "--entrypoint", "python3", image,
            "-s", "-P", f"{os.path.dirname(SCRIPT_IN_CELL)}/{here.name}", "--inside", MOUNT_POINT,
        ]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        finally:
            echo.close()
            if grpc_server is not None:
                grpc_server.stop(None)
    lines = []
    for raw_line in proc.stdout.splitlines():
        try:
            lines.append(json.loads(raw_line))
        except ValueError:
            print(raw_line)
    profile = "Docker's default profile" if seccomp == "default" else seccomp
    print(f"seccomp self-test: image {image}, profile {profile}")
    for r in lines:
        mark = "PASS" if r["ok"] else "FAIL"
        print(f"  {mark}  {r['kind']:<7}  {r['check']:<45} {r['detail']}")
    if proc.stderr.strip():
        print(proc.stderr.rstrip(), file=sys.stderr)
    failed = [r for r in lines if not r["ok"]]
    if proc.returncode not in (0, 1) or not lines:
        print(f"seccomp self-test: the cell exited with {proc.returncode}", file=sys.stderr)
        return 2
    print(f"seccomp self-test: {len(lines) - len(failed)}/{len(lines)} checks passed")
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", default=os.environ.get("CELLBLOCK_IMAGE_REF", "cellblock-cell:dev"))
    parser.add_argument("--seccomp", default=str(Path(__file__).resolve().parent / "seccomp.json"),
                        help="profile path, or 'default' for Docker's default profile (control run)")
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--inside", metavar="SOCKET_DIR", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside:
        return _inside(args.inside)
    return _host(args.image, args.seccomp, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
