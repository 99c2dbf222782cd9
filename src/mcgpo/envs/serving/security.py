"""What the server checks before it listens and on every request: the bind and the token.

The server binds 127.0.0.1 unless told otherwise. Any other address needs a shared secret
(``--token-file``): 0.0.0.0 or a LAN address without one is refused. Without a token the
server answers this machine's clients only, not a web page it has open: :func:`allowed_origin`
and :func:`allowed_host` say which ``Origin`` and ``Host`` headers pass. A token is printable
ASCII (it travels in an HTTP header); a token file others can read gets a warning
(:func:`token_file_warning`). The token is compared in
constant time (:func:`hmac.compare_digest`), so the time an answer takes tells nothing about
how much of a guess was right. It authenticates clients; it does not encrypt: put the server
behind TLS (a reverse proxy, an SSH tunnel) on a network you do not trust
(docs/envs/serving.md).
"""

from __future__ import annotations

import hmac
import ipaddress
import stat
from pathlib import Path
from urllib.parse import urlsplit

__all__ = [
    "MIN_TOKEN_CHARS",
    "ServeError",
    "allowed_host",
    "allowed_origin",
    "check_bind",
    "check_token",
    "is_loopback",
    "read_token",
    "same_token",
    "token_file_warning",
]

MIN_TOKEN_CHARS = 16


class ServeError(ValueError):
    """The server cannot start as asked (one line: an unsafe bind, a bad token file, ...)."""


def is_loopback(host: str) -> bool:
    """True for 'localhost', 127.0.0.0/8 and ::1."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _hostname(netloc: str) -> str | None:
    """The host of ``HOST[:PORT]`` (brackets of an IPv6 address dropped), or None."""
    try:
        return urlsplit(f"//{netloc}").hostname
    except ValueError:
        return None


def allowed_origin(origin: str) -> bool:
    """True for an ``Origin`` header on loopback (``http://localhost:3000``); False for any
    other site, and for ``null`` (a sandboxed page)."""
    try:
        name = urlsplit(origin).hostname
    except ValueError:
        return False
    return name is not None and is_loopback(name)


def allowed_host(host: str, bound: str) -> bool:
    """True for a ``Host`` header naming a loopback address or name, or the bound address
    ``bound``: a DNS-rebound name (``evil.example``) is refused."""
    name = _hostname(host)
    return name is not None and (is_loopback(name) or name == bound.strip("[]").lower())


def check_bind(host: str, token: str | None) -> None:
    """ServeError unless ``host`` is loopback or a token is set (0.0.0.0 always needs one)."""
    if token is None and not is_loopback(host):
        raise ServeError(
            f"binding {host} exposes the environment beyond this machine: give a shared "
            "secret with --token-file (clients send it in the X-MCGPO-Token header)"
        )


def read_token(path: str) -> str:
    """The shared secret in ``path`` (surrounding white space dropped); ServeError if unusable."""
    try:
        token = Path(path).expanduser().read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as err:
        raise ServeError(f"token file {path}: {getattr(err, 'strerror', None) or err}") from None
    if len(token) < MIN_TOKEN_CHARS:
        raise ServeError(
            f"token file {path}: the token must have at least {MIN_TOKEN_CHARS} characters"
        )
    check_token(token, f"token file {path}")
    return token


def check_token(token: str, where: str) -> None:
    """ServeError unless ``token`` is printable ASCII (an HTTP header carries it as is)."""
    if not (token.isascii() and token.isprintable()):
        raise ServeError(f"{where}: the token must be printable ASCII (letters, digits, symbols)")


def token_file_warning(path: str) -> str | None:
    """A one-line warning when the token file can be read by other users, else None."""
    try:
        mode = Path(path).expanduser().stat().st_mode
    except OSError:
        return None
    if mode & (stat.S_IRGRP | stat.S_IROTH):
        return (
            f"token file {path} can be read by other users (mode {stat.filemode(mode)}): "
            f"chmod 600 {path}"
        )
    return None


def same_token(given: str, expected: str) -> bool:
    """Constant-time comparison of a request's token with the server's."""
    return hmac.compare_digest(given.encode(), expected.encode())
