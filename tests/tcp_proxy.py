"""A TCP proxy in front of a server (the moto S3 server) that can be taken down and brought back, or slowed.

Down means what an outage looks like to a client: connections are refused and open ones are cut. The store behind
keeps its objects, so what was uploaded before the outage is still there afterwards. ``delay_s`` sleeps before
forwarding each chunk a client sends, which turns a 100 kB upload into a window of seconds (to stop a run inside it).
``hold()`` makes it a store that stops answering: connections stay open and are accepted, what clients send is
read and dropped, and nothing comes back (each request waits for its client's read timeout); ``release()`` ends it.
"""

from __future__ import annotations

import socket
import threading
import time


class TcpProxy:
    def __init__(self, target_host: str, target_port: int, delay_s: float = 0.0):
        self.target = (target_host, target_port)
        self.delay_s = delay_s
        self.held = threading.Event()
        self._listener: socket.socket | None = None
        self._connections: set[socket.socket] = set()
        self._lock = threading.Lock()
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def up(self) -> TcpProxy:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
        return self

    def hold(self) -> None:
        self.held.set()

    def release(self) -> None:
        self.held.clear()

    def down(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        with self._lock:
            for conn in self._connections:
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                conn.close()
            self._connections.clear()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # closed by down()
                return
            try:
                server = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._connections |= {client, server}
            threading.Thread(target=self._pipe, args=(client, server, self.delay_s), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, 0.0), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, delay_s: float) -> None:
        try:
            while chunk := source.recv(16384):
                if delay_s:
                    time.sleep(delay_s)
                if not self.held.is_set():
                    sink.sendall(chunk)
        except OSError:
            pass
        finally:
            for conn in (source, sink):
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                with self._lock:
                    self._connections.discard(conn)
