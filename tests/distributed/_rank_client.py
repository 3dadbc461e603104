"""Asks the tests' rank server (tests/distributed/_rank_server.py) for a job and exits with the job's exit code.

    python tests/distributed/_rank_client.py SOCKET NPROC SCRIPT [ARGS...]

Light on purpose (no torch): it is what a test starts in place of torchrun. Killing it kills the job.
"""

from __future__ import annotations

import json
import os
import socket
import sys


def main() -> int:
    path, nproc, script, args = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
    request = {"nproc": nproc, "script": os.path.abspath(script), "args": args, "cwd": os.getcwd(),
               "env": dict(os.environ)}
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(path)
        socket.send_fds(conn, [json.dumps(request).encode() + b"\n"], [0, 1, 2])
        reply = b""
        while not reply.endswith(b"\n"):
            chunk = conn.recv(64)
            if not chunk:
                print("rank server: the job ended without an exit code", file=sys.stderr)
                return 1
            reply += chunk
    return int(reply)


if __name__ == "__main__":
    sys.exit(main())
