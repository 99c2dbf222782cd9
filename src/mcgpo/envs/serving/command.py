"""``mcgpo env serve``: the command line of the environment server.

    mcgpo env serve --env webshop [--host 127.0.0.1] [--port 8765] [--token-file F]
        [--max-sessions 256] [--sessions-per-worker 1] [--step-timeout 60]
        [--idle-timeout 600] [--max-body-bytes 1048576] [--drain-seconds 3]
        [--env.<option> VALUE ...]

``--env.<option> VALUE`` are the environment's constructor options, read as TOML scalars
(``12`` an integer, ``true`` a boolean), as ``mcgpo train`` reads them. The server prints one
line, ``serving <env> on http://HOST:PORT``, once it listens (``--port 0`` picks a free port),
and stops on SIGTERM / SIGINT after the requests in flight. A bad command line or an
environment that cannot be built prints one line on stderr and exits with code 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from mcgpo.command_line import OneLineParser
from mcgpo.envs.serving.security import check_bind, read_token, token_file_warning
from mcgpo.options import parse_scalar

__all__ = ["main"]

DEFAULT_PORT = 8765


def _fail(message: str) -> int:
    print(f"mcgpo env serve: error: {message}", file=sys.stderr)
    return 2


def _parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="mcgpo env serve",
        description="Serve a registered environment over HTTP (docs/envs/serving.md).",
        allow_abbrev=False,
        epilog="--env.<option> VALUE: an option of the environment's constructor "
        "(e.g. --env.n_receptacles 12); clients must ask for the same options.",
    )
    parser.add_argument("--env", required=True, help="environment name (built in or a plugin)")
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default: %(default)s)"
    )
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help="0 picks a free port (default: %(default)s)"
    )
    parser.add_argument(
        "--token-file",
        default=None,
        help="file holding the shared secret (needed to bind a non-loopback address)",
    )
    parser.add_argument(
        "--max-sessions", type=int, default=256, help="sessions open at once (default: %(default)s)"
    )
    parser.add_argument(
        "--sessions-per-worker",
        type=int,
        default=1,
        help="sessions sharing one worker process (default: %(default)s)",
    )
    parser.add_argument(
        "--step-timeout",
        type=float,
        default=60.0,
        help="seconds a reset or step may take (default: %(default)s)",
    )
    parser.add_argument(
        "--idle-timeout",
        type=float,
        default=600.0,
        help="seconds before an idle session is closed (default: %(default)s)",
    )
    parser.add_argument(
        "--max-body-bytes",
        type=int,
        default=1 << 20,
        help="largest request body (default: %(default)s)",
    )
    parser.add_argument(
        "--drain-seconds",
        type=float,
        default=3.0,
        help="after SIGTERM, seconds /health answers 503 draining before the server stops "
        "(default: %(default)s)",
    )
    parser.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"])  # fmt: skip
    return parser


def _env_options(rest: list[str]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    i = 0
    while i < len(rest):
        key, eq, value = rest[i].partition("=")
        if not key.startswith("--env.") or len(key) <= len("--env."):
            raise ValueError(f"unknown option {key}")
        if not eq:
            if i + 1 >= len(rest) or rest[i + 1].startswith("--"):
                raise ValueError(f"option {key} needs a value")
            value = rest[i + 1]
            i += 1
        options[key[len("--env.") :].replace("-", "_")] = parse_scalar(value)
        i += 1
    return options


def main(argv: Sequence[str]) -> int:
    """``mcgpo env serve ...`` (``argv`` after ``env``); the exit code."""
    argv = list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: mcgpo env serve --env NAME [options]  (mcgpo env serve --help)")
        return 0 if argv else 2
    if argv[0] != "serve":
        return _fail(f"unknown env command {argv[0]!r}; the one command is 'serve'")
    args, rest = _parser().parse_known_args(argv[1:])
    try:
        options = _env_options(rest)
        for name in ("max_sessions", "sessions_per_worker", "max_body_bytes"):
            if getattr(args, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
        for name in ("step_timeout", "idle_timeout"):
            if not 0 < getattr(args, name) < float("inf"):
                raise ValueError(f"--{name.replace('_', '-')} must be a number > 0")
        if not 0 <= args.drain_seconds < float("inf"):
            raise ValueError("--drain-seconds must be a number >= 0")
        if not 0 <= args.port < 65536:
            raise ValueError(f"--port must be in 0..65535, got {args.port}")
        token = read_token(args.token_file) if args.token_file else None
        check_bind(args.host, token)
    except ValueError as err:
        return _fail(str(err))
    warning = token_file_warning(args.token_file) if args.token_file else None
    if warning is not None:
        print(f"mcgpo env serve: warning: {warning}", file=sys.stderr)
    try:
        from mcgpo.envs.serving.launch import serve
    except ImportError as err:
        return _fail(f"{err}; install the serve extra: pip install 'mcgpo[serve]'")
    return serve(
        args.env,
        options,
        host=args.host,
        port=args.port,
        token=token,
        max_sessions=args.max_sessions,
        sessions_per_worker=args.sessions_per_worker,
        step_timeout=args.step_timeout,
        idle_timeout=args.idle_timeout,
        max_body=args.max_body_bytes,
        log_level=args.log_level,
        drain_seconds=args.drain_seconds,
        announce=lambda url: print(f"serving {args.env} on {url}", flush=True),
    )
