"""Network faults for tests: a TCP proxy in front of PostgreSQL that can go away."""

from __future__ import annotations

import contextlib
import socket
import threading

from tests.processes import free_port


class TcpProxy:
    """Forwards a local port to PostgreSQL. ``close()`` refuses new connections and cuts
    the open ones, as a database that went away does; ``open()`` brings it back.
    ``silence()`` keeps every connection open but passes nothing on, either way: a
    host that vanished without a word (power, network), where a client's wait for an
    answer ends only with its own limits."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.port = free_port()
        self.listener: socket.socket | None = None
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        self.silent = threading.Event()

    def silence(self) -> None:
        self.silent.set()

    def speak(self) -> None:
        """Pass data on again (what was sent while silent stays lost)."""
        self.silent.clear()

    def open(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", self.port))
        self.listener.settimeout(0.1)
        threading.Thread(target=self._accept, args=(self.listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while listener.fileno() != -1:
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            client.settimeout(None)
            upstream.settimeout(None)
            with self.lock:
                self.sockets += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                if not self.silent.is_set():
                    dst.sendall(data)
        except OSError:
            pass
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        if self.listener is not None:
            self.listener.close()
            self.listener = None
        with self.lock:
            for sock in self.sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            self.sockets.clear()
