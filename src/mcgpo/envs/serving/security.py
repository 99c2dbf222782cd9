"""What the server checks before it listens and on every request: the bind and the token.

The server binds 127.0.0.1 unless told otherwise. Any other address needs a shared secret
(``--token-file``): 0.0.0.0 or a LAN address without one is refused. The token is compared in
constant time (:func:`hmac.compare_digest`), so the time an answer takes tells nothing about
how much of a guess was right. It authenticates clients; it does not encrypt: put the server
behind TLS (a reverse proxy, an SSH tunnel) on a network you do not trust
(docs/envs/serving.md).
"""

from __future__ import annotations

import hmac
import ipaddress
from pathlib import Path

__all__ = ["MIN_TOKEN_CHARS", "ServeError", "check_bind", "is_loopback", "read_token", "same_token"]

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
    return token


def same_token(given: str, expected: str) -> bool:
    """Constant-time comparison of a request's token with the server's."""
    return hmac.compare_digest(given.encode(), expected.encode())
