"""Starting the server: :func:`serve` (the command, until a signal) and :class:`ServedEnv`
(in a thread of this process, for tests, benchmarks and notebooks)."""

from __future__ import annotations

import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

import uvicorn

from mcgpo.envs.serving.security import check_bind
from mcgpo.envs.serving.server import (
    DEFAULT_MAX_BODY,
    DRAIN_SECONDS,
    JsonH11Protocol,
    Server,
    build_app,
)
from mcgpo.envs.serving.sessions import SessionTable
from mcgpo.envs.workers import EnvSpec, WorkerError

__all__ = ["ServedEnv", "serve"]


def _table(
    factory: Callable[[], Any],
    env_name: str,
    options: Mapping[str, Any],
    *,
    max_sessions: int,
    sessions_per_worker: int,
    step_timeout: float,
    idle_timeout: float,
) -> SessionTable:
    table = SessionTable(
        factory,
        env_name=env_name,
        options=options,
        max_sessions=max_sessions,
        sessions_per_worker=sessions_per_worker,
        step_timeout=step_timeout,
        idle_timeout=idle_timeout,
    )
    table.start()  # WorkerError: the environment cannot be built
    return table


def _server(
    table: SessionTable,
    host: str,
    port: int,
    token: str | None,
    max_body: int,
    log_level: str,
    on_started: Callable[[str], None] | None,
    reap_every: float | None = None,
    drain_seconds: float = DRAIN_SECONDS,
) -> Server:
    app = build_app(table, token=token, max_body=max_body, reap_every=reap_every, host=host)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        http=JsonH11Protocol,  # JSON error bodies even for requests h11 cannot parse
        log_level=log_level,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=int(table.step_timeout) + 5,  # in-flight steps finish
        timeout_keep_alive=60,
    )
    return Server(config, table, on_started, drain_seconds)


def serve(
    env_name: str,
    options: Mapping[str, Any],
    *,
    host: str = "127.0.0.1",
    port: int = 8765,
    token: str | None = None,
    max_sessions: int = 256,
    sessions_per_worker: int = 1,
    step_timeout: float = 60.0,
    idle_timeout: float = 600.0,
    max_body: int = DEFAULT_MAX_BODY,
    log_level: str = "warning",
    announce: Callable[[str], None] | None = None,
    factory: Callable[[], Any] | None = None,
    drain_seconds: float = DRAIN_SECONDS,
) -> int:
    """Serve ``make_env(env_name, **options)`` (or a picklable ``factory``'s environments,
    under the name ``env_name``) until SIGTERM / SIGINT; the exit code (2 when the bind is
    unsafe or the environment cannot be built, one line on stderr)."""
    try:
        check_bind(host, token)
        sock = _bound(host, port)  # a taken port fails before any worker starts
    except (ValueError, OSError) as err:
        print(f"mcgpo env serve: error: {err}", file=sys.stderr)
        return 2
    try:
        table = _table(
            factory if factory is not None else EnvSpec(env_name, dict(options)),
            env_name,
            options,
            max_sessions=max_sessions,
            sessions_per_worker=sessions_per_worker,
            step_timeout=step_timeout,
            idle_timeout=idle_timeout,
        )
    except (ValueError, WorkerError) as err:
        sock.close()
        print(f"mcgpo env serve: error: {err}", file=sys.stderr)
        return 2
    server = _server(
        table, host, port, token, max_body, log_level, announce, drain_seconds=drain_seconds
    )
    try:
        server.run(sockets=[sock])
    finally:
        table.shutdown()
        sock.close()
    return 0 if server.started else 2


def _bound(host: str, port: int) -> socket.socket:
    """A listening socket on (host, port); OSError naming the address when it is taken."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as err:
        sock.close()
        raise OSError(f"cannot bind {host}:{port}: {err.strerror or err}") from None
    sock.set_inheritable(True)
    return sock


class ServedEnv:
    """An environment served from a thread of this process on 127.0.0.1 (a free port):
    ``with ServedEnv(factory, "household") as url: ...``; stopped (workers too) on exit.

    ``factory`` is any picklable environment factory (the worker processes build from it),
    e.g. :class:`~mcgpo.envs.workers.EnvSpec`."""

    def __init__(
        self,
        factory: Callable[[], Any],
        env_name: str,
        options: Mapping[str, Any] | None = None,
        *,
        token: str | None = None,
        max_sessions: int = 64,
        sessions_per_worker: int = 1,
        step_timeout: float = 60.0,
        idle_timeout: float = 600.0,
        max_body: int = DEFAULT_MAX_BODY,
        reap_every: float | None = None,
    ) -> None:
        self.table = _table(
            factory,
            env_name,
            options or {},
            max_sessions=max_sessions,
            sessions_per_worker=sessions_per_worker,
            step_timeout=step_timeout,
            idle_timeout=idle_timeout,
        )
        self.server = _server(
            self.table, "127.0.0.1", 0, token, max_body, "error", None, reap_every
        )
        self._thread = threading.Thread(target=self.server.run, name="mcgpo-served-env")
        self.url = ""

    def start(self, timeout: float = 120.0) -> str:
        """Start serving; the URL. RuntimeError if it is not listening within ``timeout``."""
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the environment server did not start")
            time.sleep(0.01)
        self.url = self.server.url()
        return self.url

    def stop(self) -> None:
        """Drain, stop the server and its workers (idempotent)."""
        self.table.drain()
        self.server.should_exit = True
        if self._thread.is_alive():
            self._thread.join()
        self.table.shutdown()

    def __enter__(self) -> str:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
