"""A fork server for the multi-rank tests that test training rather than launching: it imports the training stack
once per test session, then forks every job's ranks from that state. A 2-rank job under torchrun pays the imports
(about 6 s of CPU on the CI machine) three times, torchrun's agent included; here it pays none. The tests of
launching itself (torchrun, `llmfoundry train -n`, scripts/train.py, Slurm, Ray, Kubernetes' variables) keep the
real launchers.

    python tests/distributed/_rank_server.py SOCKET          # prints "ready" once it listens

A job is asked for by tests/distributed/_rank_client.py, which the test starts as it would start torchrun: the
client sends NPROC, SCRIPT, ARGS, its working directory, its environment and its stdin/stdout/stderr (as file
descriptors), then waits for the job's exit code. The server forks a job leader, which takes on the client's
directory, environment and output, and forks the ranks with torchrun's variables (RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RUN_ID); each runs SCRIPT as ``__main__``. As under torchrun,
a failed rank ends the others (SIGTERM, then SIGKILL) and the job fails. A client that is killed (the tests' SIGKILL
of a job) closes its connection, and the leader SIGKILLs every rank at once.

The server stays single-threaded and computes nothing before a fork: torch's thread pools start in the ranks.
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import select
import signal
import socket
import sys
import threading
import time
import traceback

MAX_FDS = 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_rank(rank: int, nproc: int, port: int, script: str, args: list[str]) -> int:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc),
                      GROUP_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                      TORCHELASTIC_RUN_ID=f"forked-{os.getppid()}")
    sys.argv = [script, *args]
    try:
        runpy.run_path(script, run_name="__main__")
        return 0
    except SystemExit as stop:
        if isinstance(stop.code, str):
            print(stop.code, file=sys.stderr)  # as the interpreter prints sys.exit("message")
        return stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:  # noqa: BLE001 - printed as an uncaught exception is, then the rank's exit code
        traceback.print_exc()
        return 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def _signal_all(pids, sig) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _reap(ranks: dict[int, int]) -> list[tuple[int, int]]:
    """(pid, exit code) of the ranks that ended since the last call."""
    ended = []
    while ranks:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            break
        if ranks.pop(pid, None) is not None:
            ended.append((pid, os.waitstatus_to_exitcode(status)))
    return ended


def _lead(conn: socket.socket, request: dict) -> int:
    """The job leader: forks the ranks and waits for them, or for its client to go away."""
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    port = _free_port()
    ranks: dict[int, int] = {}
    for rank in range(request["nproc"]):
        pid = os.fork()
        if pid == 0:
            conn.close()
            _exit(_run_rank(rank, request["nproc"], port, request["script"], request["args"]))
        ranks[pid] = rank
    code = 0
    while ranks:
        readable, _, _ = select.select([conn], [], [], 0.02)
        if readable and not conn.recv(1):  # the client was killed: so is the job, at once
            _signal_all(ranks, signal.SIGKILL)
            code = -signal.SIGKILL
        for _, exit_code in _reap(ranks):
            if exit_code != 0 and code == 0:
                code = exit_code if exit_code > 0 else 128 - exit_code
                _signal_all(ranks, signal.SIGTERM)  # as torchrun does; what is left after 5 s is killed
                deadline = time.monotonic() + 5
                while ranks and time.monotonic() < deadline:
                    _reap(ranks)
                    time.sleep(0.05)
                _signal_all(ranks, signal.SIGKILL)
    return code


def _read_request(conn: socket.socket) -> tuple[dict | None, list[int]]:
    """The client's request (one line of JSON) and the file descriptors sent with it; None if incomplete."""
    message, fds, _, _ = socket.recv_fds(conn, 1 << 16, MAX_FDS)
    while message and not message.endswith(b"\n"):
        chunk = conn.recv(1 << 16)
        if not chunk:
            break
        message += chunk
    try:
        return (json.loads(message) if message.endswith(b"\n") else None), list(fds)
    except ValueError:
        return None, list(fds)


def _exit(code: int) -> None:
    """End a forked rank as the interpreter ends a process (non-daemon threads joined, atexit handlers run, output
    flushed), without unwinding into the server's loop."""
    try:
        threading._shutdown()  # what Python runs at exit: wait for non-daemon threads
        atexit._run_exitfuncs()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve(path: str) -> None:
    import llmfoundry.cli  # noqa: F401 - the heavy imports, once, before any fork
    import llmfoundry.train.run  # noqa: F401

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    print("ready", flush=True)
    while True:
        readable, _, _ = select.select([listener, sys.stdin], [], [])
        if sys.stdin in readable and not os.read(sys.stdin.fileno(), 1):
            return  # the test session that started this server is gone (its end of the pipe closed)
        if listener not in readable:
            continue
        conn, _ = listener.accept()
        request, fds = _read_request(conn)
        if request is None:  # a client gone mid-request, or not one of ours
            for fd in fds:
                os.close(fd)
            conn.close()
            continue
        leader = os.fork()
        if leader == 0:
            listener.close()
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
                os.close(fd)
            try:
                code = _lead(conn, request)
            except BaseException:  # noqa: BLE001 - the job fails, the server goes on
                traceback.print_exc()
                code = 1
            try:
                conn.sendall(f"{code}\n".encode())
            except OSError:
                pass
            os._exit(0)
        for fd in fds:
            os.close(fd)
        conn.close()
        while True:  # reap finished leaders
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break


if __name__ == "__main__":
    serve(sys.argv[1])
