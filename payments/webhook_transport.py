"""Outbound HTTP for webhooks: which URLs may be called, and a request that cannot
be turned against the service's own network or hold a worker past its budget.

**Address rules** (``check_url`` at registration, ``post`` again at connect
time): the scheme is ``https`` (``http`` only with ``WEBHOOK_ALLOW_HTTP``), no
userinfo, no known metadata/internal host name, and the host resolves to
addresses that are *all* publicly routable (``is_public_address``). Hosts in
``WEBHOOK_ALLOWED_HOSTS`` skip the address rules (not the scheme rule).

**No DNS-rebinding window**: ``post`` resolves the host once, checks every
address, and connects to a checked address itself (``_PinnedConnection``):
``http.client`` never looks the name up again. The URL's host name is still
used for the ``Host`` header, TLS SNI and certificate verification.

**No redirects**: ``http.client`` does not follow them; a 3xx is reported as
``redirect_not_followed``. No proxy from the environment is used either.

**One deadline for the whole request** (``Deadline``): the DNS lookup runs in a
thread of its own and is waited for at most the remaining budget; every socket
operation (connect, TLS handshake, each send, each receive) first sets the
socket timeout to what is left of the budget, and fails once nothing is left.
CPython applies a socket timeout as a deadline over one call (``sendall``, one
TLS read or handshake), so the sum over all calls cannot exceed the budget: a
server dripping one byte a second is cut off like a silent one. No timer
thread and no signal: safe in Celery's thread pool, and no race with a socket
closed (and its descriptor reused) by another thread.

**Generic errors**: ``post`` returns an ``Outcome`` whose ``error`` is one of
``ERROR_CLASSES`` (or ``http_<status>``); the exception itself only goes to the
server log. Clients never see a network message (a port-scan oracle), nor
whether a name failed to resolve or resolved to a refused address.
"""

from __future__ import annotations

import functools
import http.client
import ipaddress
import logging
import socket
import ssl
import threading
import time
import urllib.parse
from dataclasses import dataclass

from django.conf import settings

logger = logging.getLogger(__name__)

TIMEOUT = "timeout"
CONNECTION_FAILED = "connection_failed"
TLS_ERROR = "tls_error"
ADDRESS_NOT_ALLOWED = "address_not_allowed"
REDIRECT_NOT_FOLLOWED = "redirect_not_followed"
INVALID_RESPONSE = "invalid_response"
ERROR_CLASSES = (
    TIMEOUT,
    CONNECTION_FAILED,
    TLS_ERROR,
    ADDRESS_NOT_ALLOWED,
    REDIRECT_NOT_FOLLOWED,
    INVALID_RESPONSE,
)

# Cloud metadata services and names that only make sense inside a private
# network, refused by name whatever they resolve to (resolution can differ
# between the API host and the worker host).
METADATA_HOSTS = frozenset(
    {
        "metadata",
        "metadata.google.internal",
        "metadata.goog",
        "metadata.azure.com",
        "metadata.tencentyun.com",
        "instance-data",
        "instance-data.ec2.internal",
        "localhost",
        "localhost.localdomain",
        "ip6-localhost",
        "ip6-loopback",
    }
)
INTERNAL_SUFFIXES = (".internal", ".local", ".localhost", ".localdomain", ".home.arpa", ".intranet")

# Not covered (or not on every Python version) by ``ipaddress``' flags.
EXTRA_BLOCKED_NETWORKS = tuple(
    ipaddress.ip_network(n)
    for n in (
        "0.0.0.0/8",  # "this network"
        "100.64.0.0/10",  # carrier-grade NAT (Alibaba's metadata is 100.100.100.200)
        "168.63.129.16/32",  # Azure's WireServer: platform metadata, reachable from any VM
        "192.0.0.0/24",  # IETF protocol assignments
        "198.18.0.0/15",  # benchmarking
        "64:ff9b::/96",  # NAT64: would reach any IPv4 address through the gateway
        "64:ff9b:1::/48",  # local-use NAT64
        "2001::/32",  # Teredo
        "fc00::/7",  # unique local (fd00::/8 included)
        "fec0::/10",  # deprecated site-local
    )
)

_REGISTRATION_REFUSED = "Webhook URLs must use https and a public internet host name or address."


class UrlRefused(Exception):
    """The URL breaks an address rule; ``str(exc)`` is safe to show the client."""


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str  # ASCII (IDNA), lower case, IPv6 without brackets, no trailing dot
    port: int
    path: str  # path and query, as sent in the request line
    allowlisted: bool


@dataclass(frozen=True)
class Outcome:
    status_code: int | None
    error: str  # "" on success; else one of ERROR_CLASSES or "http_<status>"

    @property
    def ok(self) -> bool:
        return self.error == ""


# --- address rules --------------------------------------------------------------


def is_public_address(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """True only for a globally routable unicast address.

    Refuses loopback, private (RFC 1918, fc00::/7), link-local (169.254/16 and
    so the metadata address, fe80::/10), multicast, reserved, unspecified
    (0.0.0.0, ::), shared 100.64/10, documentation and benchmark ranges, and
    IPv6 forms that carry an IPv4 address (mapped, compatible, 6to4, NAT64)
    unless the carried address is itself public.
    """
    if ip.version == 6:
        embedded = ip.ipv4_mapped or ip.sixtofour
        if embedded is None and int(ip) >> 32 == 0:  # ::a.b.c.d (IPv4-compatible)
            embedded = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if embedded is not None and not is_public_address(embedded):
            return False
        if ip.is_site_local:
            return False
    return (
        ip.is_global
        and not ip.is_private
        and not ip.is_loopback
        and not ip.is_link_local
        and not ip.is_multicast
        and not ip.is_reserved
        and not ip.is_unspecified
        and not any(ip in net for net in EXTRA_BLOCKED_NETWORKS if net.version == ip.version)
    )


def parse_target(url: str) -> Target:
    """The URL's parts after the rules that need no DNS; raises ``UrlRefused``."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:
        raise UrlRefused("Enter a valid URL.") from None
    if settings.WEBHOOK_ALLOW_HTTP:
        if parts.scheme not in ("https", "http"):
            raise UrlRefused("Webhook URLs must use https or http.")
    elif parts.scheme != "https":
        raise UrlRefused("Webhook URLs must use https.")
    if port == 0:
        raise UrlRefused("Enter a valid URL.")
    if "@" in parts.netloc:
        raise UrlRefused("Webhook URLs must not contain a user name or password.")
    raw_host = (parts.hostname or "").rstrip(".")
    if not raw_host:
        raise UrlRefused("Enter a valid URL.")
    try:
        ip = ipaddress.ip_address(raw_host)
    except ValueError:
        ip = None
    if ip is not None:
        host = str(ip)
    else:
        try:
            host = raw_host.encode("idna").decode("ascii").lower()
        except UnicodeError:
            raise UrlRefused("Enter a valid URL.") from None
    allowlisted = _allowlisted(host, ip)
    if not allowlisted and (host in METADATA_HOSTS or host.endswith(INTERNAL_SUFFIXES)):
        raise UrlRefused(_REGISTRATION_REFUSED)
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    # The request line is ASCII: anything else (``/café``, a space) goes
    # percent-encoded, as a browser sends it; what is already encoded and the
    # URL's own delimiters stay as they are. Unencoded, http.client could not
    # send it and every attempt failed as connection_failed (a review, session 42).
    path = urllib.parse.quote(path, safe=_PATH_SAFE)
    default_port = 443 if parts.scheme == "https" else 80
    return Target(parts.scheme, host, port or default_port, path, allowlisted)


# RFC 3986's reserved and unreserved characters, and ``%`` (already encoded)
_PATH_SAFE = "/?#[]@!$&'()*+,;=%:~-._"


def _allowlisted(host: str, ip) -> bool:
    for entry in settings.WEBHOOK_ALLOWED_HOSTS:
        entry = entry.strip().lower().strip("[]").rstrip(".")
        if entry == host:
            return True
        if ip is not None:
            try:
                if ipaddress.ip_address(entry) == ip:
                    return True
            except ValueError:
                continue
    return False


def resolve(host: str, port: int) -> list[tuple[int, tuple]]:
    """Every ``(family, sockaddr)`` the host resolves to (TCP). The one DNS lookup
    of this module: registration and delivery both go through it."""
    seen, found = set(), []
    for family, _, _, _, sockaddr in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        if family in (socket.AF_INET, socket.AF_INET6) and sockaddr not in seen:
            seen.add(sockaddr)
            found.append((family, sockaddr))
    return found


def _lookup(host: str, port: int, timeout: float) -> list[tuple[int, tuple]]:
    """``resolve`` in its own short-lived daemon thread, waited for at most ``timeout``.

    getaddrinfo cannot be interrupted; a lookup the caller stops waiting for
    ends by itself with the system resolver's timeout. One thread per lookup
    (no shared pool) so a hanging name server of one endpoint cannot queue
    other endpoints' lookups behind it, and nothing is left to repair after a
    fork (Celery prefork, gunicorn).
    """
    if timeout <= 0:
        raise TimeoutError("no time left for the DNS lookup")
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["addresses"] = resolve(host, port)
        except Exception as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=run, name="webhook-dns", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise TimeoutError("DNS lookup timed out")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["addresses"]


def _checked_addresses(target: Target, timeout: float) -> list[tuple[int, tuple]]:
    """Resolve ``target.host``; every address must be public unless allowlisted.

    Raises ``UrlRefused`` (with a message that does not name an address) if
    the name does not resolve or any address is refused; ``TimeoutError`` if
    the lookup outlives ``timeout``.
    """
    try:
        addresses = _lookup(target.host, target.port, timeout)
    except (OSError, UnicodeError) as exc:
        if isinstance(exc, TimeoutError):
            raise
        raise UrlRefused(_REGISTRATION_REFUSED) from exc
    if not addresses:
        raise UrlRefused(_REGISTRATION_REFUSED)
    if not target.allowlisted:
        for _, sockaddr in addresses:
            if not is_public_address(ipaddress.ip_address(sockaddr[0].split("%", 1)[0])):
                raise UrlRefused(_REGISTRATION_REFUSED)
    return addresses


def check_url(url: str) -> str:
    """Registration: raise ``UrlRefused`` unless ``url`` may be called now.

    Returns the URL unchanged. The same rules run again at every delivery
    against the address actually connected to.
    """
    target = parse_target(url)
    try:
        _checked_addresses(target, settings.WEBHOOK_REGISTRATION_DNS_SECONDS)
    except TimeoutError:
        raise UrlRefused(_REGISTRATION_REFUSED) from None
    return url


# --- the request ----------------------------------------------------------------


class Deadline:
    """The wall-clock budget of one request, shared by all its socket operations."""

    def __init__(self, seconds: float):
        self.expires = time.monotonic() + seconds

    def remaining(self) -> float:
        left = self.expires - time.monotonic()
        if left <= 0:
            raise TimeoutError("webhook request budget used up")
        return left


class _DeadlineSocket(socket.socket):
    """A TCP socket whose every blocking call is bounded by the request's deadline."""

    deadline: Deadline

    def _arm(self):
        self.settimeout(self.deadline.remaining())

    def connect(self, address):
        self._arm()
        return super().connect(address)

    def send(self, data, flags=0):
        self._arm()
        return super().send(data, flags)

    def sendall(self, data, flags=0):
        self._arm()
        return super().sendall(data, flags)

    def recv(self, bufsize, flags=0):
        self._arm()
        return super().recv(bufsize, flags)

    def recv_into(self, buffer, nbytes=0, flags=0):
        self._arm()
        return super().recv_into(buffer, nbytes, flags)


class _DeadlineSSLSocket(ssl.SSLSocket):
    """The TLS side of ``_DeadlineSocket``: handshake, reads and writes re-armed."""

    deadline: Deadline

    def _arm(self):
        self.settimeout(self.deadline.remaining())

    def do_handshake(self, block=False):
        self._arm()
        return super().do_handshake(block)

    def read(self, len=1024, buffer=None):
        self._arm()
        return super().read(len, buffer)

    def write(self, data):
        self._arm()
        return super().write(data)

    def send(self, data, flags=0):
        self._arm()
        return super().send(data, flags)

    def sendall(self, data, flags=0):
        # SSLSocket.sendall loops over self.send, each re-armed.
        return super().sendall(data, flags)

    def recv(self, buflen=1024, flags=0):
        self._arm()
        return super().recv(buflen, flags)

    def recv_into(self, buffer, nbytes=None, flags=0):
        self._arm()
        return super().recv_into(buffer, nbytes, flags)


@functools.cache
def ssl_context() -> ssl.SSLContext:
    """Certificate and host-name verification against the system's CA store.

    Built once per process (loading the CA store costs ~20 ms of CPU) and
    shared by all threads, which ``SSLContext.wrap_socket`` allows.
    """
    context = ssl.create_default_context()
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.sslsocket_class = _DeadlineSSLSocket
    return context


class _PinnedConnection(http.client.HTTPConnection):
    """An HTTP(S) connection to already-checked addresses of ``host``.

    ``connect`` never resolves ``host``: it tries the given addresses in order.
    ``host`` (and ``port``) still make the Host header and, with TLS, the SNI
    name and the name the certificate must match.
    """

    def __init__(self, target: Target, addresses, deadline: Deadline, context=None):
        super().__init__(target.host, target.port)
        self.default_port = 443 if target.scheme == "https" else 80
        self._addresses = addresses
        self._deadline = deadline
        self._context = context

    def connect(self):
        last_error: OSError | None = None
        for family, sockaddr in self._addresses:
            sock = _DeadlineSocket(family, socket.SOCK_STREAM)
            sock.deadline = self._deadline
            try:
                sock.connect(sockaddr)
            except OSError as exc:
                sock.close()
                if isinstance(exc, TimeoutError):
                    raise
                last_error = exc
                continue
            break
        else:
            raise last_error or OSError("no address to connect to")
        if self._context is not None:
            try:
                tls = self._context.wrap_socket(
                    sock, server_hostname=self.host, do_handshake_on_connect=False
                )
            except BaseException:
                sock.close()
                raise
            tls.deadline = self._deadline
            self.sock = tls
            tls.do_handshake()
        else:
            self.sock = sock


def _request(target: Target, addresses, deadline: Deadline, body: bytes, headers: dict) -> int:
    context = None
    if target.scheme == "https":
        context = ssl_context()
        context.sslsocket_class = _DeadlineSSLSocket  # already so; kept for any other context
    connection = _PinnedConnection(target, addresses, deadline, context)
    try:
        connection.request("POST", target.path, body=body, headers=headers)
        response = connection.getresponse()
        # Status line and headers only: the body is never read, so a large or
        # endless body costs nothing.
        return response.status
    finally:
        connection.close()


def post(url: str, body: bytes, headers: dict, *, budget: float) -> Outcome:
    """POST ``body`` to ``url`` under the address rules, within ``budget`` seconds."""
    deadline = Deadline(budget)
    status_code: int | None = None
    try:
        target = parse_target(url)
        addresses = _checked_addresses(target, deadline.remaining())
        status_code = _request(target, addresses, deadline, body, headers)
    except UrlRefused as exc:
        return _failed(ADDRESS_NOT_ALLOWED, url, exc)
    except TimeoutError as exc:
        return _failed(TIMEOUT, url, exc)
    except (ssl.SSLError, ssl.CertificateError) as exc:
        return _failed(TLS_ERROR, url, exc)
    except http.client.HTTPException as exc:
        return _failed(INVALID_RESPONSE, url, exc)
    except (OSError, ValueError) as exc:
        return _failed(CONNECTION_FAILED, url, exc)
    if 200 <= status_code < 300:
        return Outcome(status_code, "")
    if 300 <= status_code < 400:
        return Outcome(status_code, REDIRECT_NOT_FOLLOWED)
    return Outcome(status_code, f"http_{status_code}")


def _failed(error: str, url: str, exc: BaseException) -> Outcome:
    # The raw reason stays on the server: operators need it, clients must not see it.
    # The URL without its path and query: receivers put tokens there (?token=…),
    # which have no place in our logs.
    logger.info("webhook request to %s failed (%s): %r", _origin(url), error, exc)
    return Outcome(None, error)


def _origin(url: str) -> str:
    """``scheme://host[:port]`` of ``url``, for logs (no user info, path or query)."""
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "(an unreadable URL)"
    return f"{parts.scheme}://{host}{port}"
