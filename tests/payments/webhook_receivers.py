"""Local webhook receivers on 127.0.0.1 (never anything off this machine)."""

from __future__ import annotations

import datetime
import socket
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Receiver:
    """A local HTTP(S) server answering with the queued answers (then 200).

    An answer is a status code or ``(status, headers)``. ``hold`` (an Event),
    when set by a test, makes every request wait for it before answering.
    """

    def __init__(self, tls_context: ssl.SSLContext | None = None, host_for_url="127.0.0.1"):
        self.requests = []  # (headers, body, path)
        self.answers = []
        self.hold: threading.Event | None = None
        self.sni_names = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                receiver.requests.append((dict(self.headers), body, self.path))
                if receiver.hold is not None:
                    receiver.hold.wait(30)
                answer = receiver.answers.pop(0) if receiver.answers else 200
                status, headers = answer if isinstance(answer, tuple) else (answer, {})
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_HEAD = do_PUT = do_POST  # a followed redirect would arrive as GET

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        port = self.server.server_address[1]
        scheme = "http"
        if tls_context is not None:
            tls_context.sni_callback = lambda sock, name, ctx: self.sni_names.append(name)
            self.server.socket = tls_context.wrap_socket(self.server.socket, server_side=True)
            scheme = "https"
        self.port = port
        self.url = f"{scheme}://{host_for_url}:{port}/hooks"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        if self.hold is not None:
            self.hold.set()
        self.server.shutdown()
        self.server.server_close()


class DripServer:
    """Answers ``HTTP/1.1 200 OK`` and then a header one byte every ``interval``
    seconds: each read returns quickly, the whole response takes
    ``length * interval`` seconds."""

    def __init__(self, length: int = 40, interval: float = 0.1, tls_context=None, host="127.0.0.1"):
        self.length, self.interval = length, interval
        self.tls_context = tls_context
        self.requests = 0
        self.completed = False
        self.listener = socket.create_server(("127.0.0.1", 0))
        scheme = "http" if tls_context is None else "https"
        self.url = f"{scheme}://{host}:{self.listener.getsockname()[1]}/hooks"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        try:
            conn, _ = self.listener.accept()
            if self.tls_context is not None:
                conn = self.tls_context.wrap_socket(conn, server_side=True)
        except OSError:
            return
        with conn:
            conn.settimeout(10)
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            self.requests += 1
            try:
                conn.sendall(b"HTTP/1.1 200 OK\r\nX-Drip: ")
                for _ in range(self.length):
                    time.sleep(self.interval)
                    conn.sendall(b"x")
                conn.sendall(b"\r\nContent-Length: 0\r\n\r\n")
                self.completed = True
            except OSError:
                pass

    def close(self):
        self.listener.close()
        self.thread.join(self.length * self.interval + 5)


def self_signed(tmp_path, name: str) -> tuple[str, str]:
    """A self-signed certificate for DNS name ``name``: (cert path, key path)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / f"{name}.crt", tmp_path / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return str(cert_path), str(key_path)
