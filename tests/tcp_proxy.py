"""A TCP relay for the tests of a server that goes away: Redis that stops answering, a
snapshot database that drops its connections and comes back."""

from __future__ import annotations

import contextlib
import socket
import threading


class Proxy:
    """A TCP relay on a free port to ``host:port`` that can be cut (its connections closed
    and nothing listening on its port) and restored (listening on the same port again), or
    hung (it keeps every connection open and relays nothing: a server that stopped
    answering)."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.hung = threading.Event()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.sockets: list[socket.socket] = []
        self.threads: list[threading.Thread] = []
        self._listen()

    def _listen(self) -> None:
        t = threading.Thread(target=self._accept, args=(self.server,), daemon=True)
        self.threads.append(t)
        t.start()

    def _accept(self, server: socket.socket) -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self.sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                t = threading.Thread(target=self._pipe, args=(a, b), daemon=True)
                self.threads.append(t)
                t.start()

    def _pipe(self, a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                if self.hung.is_set():
                    continue
                b.sendall(data)
        except OSError:
            pass
        for s in (a, b):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        with contextlib.suppress(OSError):  # wakes the accept: the port stops listening
            self.server.shutdown(socket.SHUT_RDWR)
        self.server.close()
        for s in self.sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
        self.sockets.clear()
        for t in self.threads:
            t.join(5)
        self.threads.clear()

    def restore(self) -> None:
        """Listening again, on the same port, after ``cut``."""
        self.server = socket.create_server(("127.0.0.1", self.port))
        self._listen()
