"""``mcgpo env serve``: one registered environment over HTTP (Starlette on uvicorn).

Endpoints (docs/envs/serving.md gives every body): ``GET /health``; ``GET /v1/spec`` (the
environment's name, options, turn limit, step timeout); ``POST /v1/sessions`` (open one,
idempotent for a client-chosen id); ``POST /v1/sessions/{id}/reset``, ``.../step``;
``GET /v1/sessions/{id}/expert``; ``DELETE /v1/sessions/{id}``. Sessions live in worker
processes (:mod:`mcgpo.envs.serving.sessions`); the environment calls run in a thread pool
so the event loop keeps answering while steps run.

Errors are ``{"error": {"code", "message"}}``: a bad request is a 4xx naming what is wrong
(malformed JSON, a missing or mistyped field, an unknown session, a body over
``max_body_bytes``), and the server goes on serving. An environment that raises, times out
or crashes ends its session: 500 ``env_error``, 504 ``env_timeout``, 502 ``env_crash``.

Security: the server binds 127.0.0.1 unless told otherwise, and will not bind any other
address without a shared-secret token, which every request but ``/health`` must then carry in
the ``X-MCGPO-Token`` header (compared in constant time). Without a token (loopback) a web
page the user visits must not reach it: a request whose ``Origin`` is not on loopback, or
whose ``Host`` is not a loopback name or the bound address (DNS rebinding), is refused (403
``forbidden_origin`` / ``forbidden_host``). A POST body must be ``application/json`` (415
otherwise: a browser cannot send that cross-origin without asking first), nested at most
:data:`~mcgpo.envs.serving.wire.MAX_DEPTH` levels. On SIGTERM (or SIGINT) it opens no more
sessions and ``/health`` answers ``503 draining`` for ``drain_seconds`` (default
:data:`DRAIN_SECONDS`) while it still listens, then it lets the requests in flight finish
and stops its workers (a second signal stops it at once). A request the HTTP parser refuses
(headers over uvicorn's limit, a malformed request line) still gets a JSON error body.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from uvicorn.protocols.http.h11_impl import DEFAULT_MAX_INCOMPLETE_EVENT_SIZE, H11Protocol

from mcgpo.envs.serving.security import allowed_host, allowed_origin, same_token
from mcgpo.envs.serving.sessions import EnvFailure, SessionTable
from mcgpo.envs.serving.wire import (
    PROTOCOL,
    TOKEN_HEADER,
    WireError,
    check_body,
    clipped,
    error_body,
    json_bytes,
    observation_json,
    step_result_json,
)

__all__ = ["DEFAULT_MAX_BODY", "DRAIN_SECONDS", "JsonH11Protocol", "Server", "build_app"]

DEFAULT_MAX_BODY = 1 << 20  # bytes of a request body (an action is a line of text)
DRAIN_SECONDS = 3.0  # after SIGTERM: seconds /health says "draining" before the server stops
_OPEN = {"session": ("string", False), "env": ("string", False), "options": ("object", False)}
_RESET = {"seed": ("integer", True), "split": ("string", False)}
_STEP = {"action": ("string", True)}


def _json(body: Any, status: int = 200) -> Response:
    return Response(json_bytes(body), status_code=status, media_type="application/json")


def _error(status: int, code: str, message: str, **extra: Any) -> Response:
    return _json(error_body(code, message, **extra), status)


async def _body(request: Request, limit: int) -> bytes:
    """The request body, or WireError 413 once it passes ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise WireError(
            413, "body_too_large", f"the body has {declared} bytes; the limit is {limit}"
        )
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise WireError(413, "body_too_large", f"the body passes the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def build_app(
    table: SessionTable,
    *,
    token: str | None = None,
    max_body: int = DEFAULT_MAX_BODY,
    reap_every: float | None = None,
    host: str = "127.0.0.1",
) -> Starlette:
    """The ASGI app serving ``table`` (already started) on the bound address ``host``; see
    the module docstring."""
    service = _Service(table, token, max_body, reap_every, host)
    return Starlette(
        routes=service.routes(),
        exception_handlers={HTTPException: _http_error, Exception: _internal},
        lifespan=service.lifespan,
    )


class _Service:
    """The state the endpoints share: the session table, the thread pool the environment
    calls run in, the token and the body limit."""

    def __init__(
        self,
        table: SessionTable,
        token: str | None,
        max_body: int,
        reap_every: float | None,
        host: str,
    ) -> None:
        self.table = table
        self.token = token
        self.host = host
        self.max_body = max_body
        self.reap_every = reap_every
        self.threads = ThreadPoolExecutor(table.max_sessions + 4, thread_name_prefix="mcgpo-serve")

    def routes(self) -> list[Route]:
        guarded = self.guarded
        return [
            Route("/health", guarded(self.health, open_=True), methods=["GET"]),
            Route("/v1/spec", guarded(self.spec), methods=["GET"]),
            Route("/v1/sessions", guarded(self.open_session), methods=["POST"]),
            Route("/v1/sessions/{sid}/reset", guarded(self.reset), methods=["POST"]),
            Route("/v1/sessions/{sid}/step", guarded(self.step), methods=["POST"]),
            Route("/v1/sessions/{sid}/expert", guarded(self.expert), methods=["GET"]),
            Route("/v1/sessions/{sid}", guarded(self.close), methods=["DELETE"]),
        ]

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        reaper = asyncio.create_task(_reap(self.table, self.blocking, self.reap_every))
        try:
            yield
        finally:
            reaper.cancel()
            await self.blocking(self.table.shutdown)
            self.threads.shutdown(wait=False)

    # --- plumbing: the thread pool, the token, the error bodies ---

    async def blocking(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.threads, fn, *args)

    def authorised(self, request: Request) -> None:
        if self.token is None:  # loopback, no token: only this machine's own clients
            self.same_machine(request)
            return
        if not same_token(request.headers.get(TOKEN_HEADER, ""), self.token):
            raise WireError(401, "unauthorized", f"missing or wrong {TOKEN_HEADER} header")

    def same_machine(self, request: Request) -> None:
        """WireError 403 for a request a web page could have sent: an ``Origin`` not on
        loopback, a ``Host`` that is neither a loopback name nor the bound address."""
        origin = request.headers.get("origin")
        if origin is not None and not allowed_origin(origin):
            raise WireError(403, "forbidden_origin", f"requests from origin {origin!r} are refused")
        host = request.headers.get("host")
        if host is not None and not allowed_host(host, self.host):
            raise WireError(403, "forbidden_host", f"Host {host!r} is not this server's")

    def guarded(
        self, handler: Callable[[Request], Awaitable[Response]], *, open_: bool = False
    ) -> Callable[[Request], Awaitable[Response]]:
        """``handler`` behind the token check (unless ``open_``), its errors as bodies."""

        async def wrapped(request: Request) -> Response:
            try:
                if not open_:
                    self.authorised(request)
                elif self.token is None:
                    self.same_machine(request)
                if request.method == "POST":
                    _json_only(request)
                return await handler(request)
            except WireError as err:
                return _error(err.status, err.code, err.message)
            except EnvFailure as err:
                return _error(err.status, err.code, str(err), session_ended=True)

        return wrapped

    # --- the server: health and spec ---

    async def health(self, request: Request) -> Response:
        table = self.table
        status = "draining" if table.draining else "ok"
        body = {"status": status, "env": table.env_name, "protocol": PROTOCOL, **table.stats()}
        return _json(body, 503 if table.draining else 200)

    async def spec(self, request: Request) -> Response:
        table = self.table
        return _json(
            {
                "env": table.env_name,
                "options": table.options,
                "max_turns": table.max_turns,
                "step_timeout": table.step_timeout,
                "max_sessions": table.max_sessions,
                "protocol": PROTOCOL,
            }
        )

    # --- sessions: open, reset, step, expert, close ---

    async def open_session(self, request: Request) -> Response:
        table = self.table
        body = check_body(await _body(request, self.max_body), _OPEN)
        env = body.get("env", table.env_name)
        if env != table.env_name:
            raise WireError(
                404, "unknown_env", f"this server serves {table.env_name!r}, not {env!r}"
            )
        if "options" in body:
            _same_options(body["options"], table.options)
        session, new = await self.blocking(table.open, body.get("session"))
        return _json(
            {
                "session": session.id,
                "env": table.env_name,
                "max_turns": session.max_turns,
                "step_timeout": table.step_timeout,
            },
            201 if new else 200,
        )

    async def reset(self, request: Request) -> Response:
        sid = request.path_params["sid"]
        body = check_body(await _body(request, self.max_body), _RESET)
        obs = await self.blocking(self.table.reset, sid, body["seed"], body.get("split", "train"))
        return _encoded(self.table, sid, lambda: {"observation": observation_json(obs)})

    async def step(self, request: Request) -> Response:
        sid = request.path_params["sid"]
        body = check_body(await _body(request, self.max_body), _STEP)
        res = await self.blocking(self.table.step, sid, body["action"])
        return _encoded(self.table, sid, lambda: step_result_json(res))

    async def expert(self, request: Request) -> Response:
        action = await self.blocking(self.table.expert, request.path_params["sid"])
        return _json({"action": action})

    async def close(self, request: Request) -> Response:
        sid = request.path_params["sid"]
        await self.blocking(self.table.close, sid)
        return _json({"closed": sid})


def _json_only(request: Request) -> None:
    """WireError 415 unless the request says its body is JSON."""
    kind = request.headers.get("content-type", "")
    if kind.split(";")[0].strip().lower() != "application/json":
        raise WireError(
            415,
            "unsupported_media_type",
            f"the body must be Content-Type: application/json, got {kind or 'none'!r}",
        )


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    message = clipped(f"{request.method} {request.url.path}: {exc.detail}")
    return _error(exc.status_code, code, message)


async def _internal(request: Request, exc: Exception) -> Response:
    return _error(500, "internal", clipped(f"{type(exc).__name__}: {exc}"))


def _same_options(given: Mapping[str, Any], served: Mapping[str, Any]) -> None:
    """WireError 409 naming the first option a client asks differently from the server."""
    for key in sorted(set(given) | set(served)):
        if key not in served or key not in given or given[key] != served[key]:
            want = json.dumps(given.get(key, "(default)"))
            have = json.dumps(served.get(key, "(default)"))
            raise WireError(
                409,
                "options_mismatch",
                f"option {key!r}: the request asks {want}, this server's environment has "
                f"{have} (start the server with the same --env.<option> values)",
            )


def _encoded(table: SessionTable, sid: str, body: Callable[[], Any]) -> Response:
    """The body as JSON; a value JSON cannot hold ends the session (500 env_error)."""
    try:
        return _json(body())
    except (TypeError, ValueError) as err:
        with contextlib.suppress(WireError):
            table.close(sid, f"its result is not JSON: {err}")
        return _error(500, "env_error", f"the result is not JSON: {err}", session_ended=True)


async def _reap(table: SessionTable, blocking: Any, every: float | None) -> None:
    """Close idle sessions every ``every`` seconds (default: a quarter of the idle timeout)."""
    period = every if every is not None else max(1.0, table.idle_timeout / 4)
    while True:
        await asyncio.sleep(period)
        await blocking(table.reap)


class Server(uvicorn.Server):
    """uvicorn's server, draining the session table on SIGTERM / SIGINT for
    ``drain_seconds`` before it stops; ``on_started(url)`` is called once it listens."""

    def __init__(
        self,
        config: uvicorn.Config,
        table: SessionTable,
        on_started: Callable[[str], None] | None = None,
        drain_seconds: float = DRAIN_SECONDS,
    ) -> None:
        super().__init__(config)
        self.table = table
        self.on_started = on_started
        self.drain_seconds = float(drain_seconds)
        self.drain_until: float | None = None

    async def startup(self, sockets: Any = None) -> None:
        await super().startup(sockets)
        if self.started and self.on_started is not None:
            self.on_started(self.url())

    def handle_exit(self, sig: int, frame: Any) -> None:
        """The first signal drains: no new session, ``/health`` says so for
        ``drain_seconds`` while the server still listens, then it stops (:meth:`on_tick`);
        a second signal stops it now."""
        if self.table.draining:
            super().handle_exit(sig, frame)
            return
        self.table.drain()
        self._captured_signals.append(sig)  # uvicorn raises it again once stopped
        self.drain_until = time.monotonic() + self.drain_seconds

    async def on_tick(self, counter: int) -> bool:
        if self.drain_until is not None and time.monotonic() >= self.drain_until:
            self.should_exit = True
        return await super().on_tick(counter)

    def url(self) -> str:
        """``http://HOST:PORT`` with the port actually bound (port 0 picks one)."""
        host, port = self.servers[0].sockets[0].getsockname()[:2]
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class JsonH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, whose answer to a request it cannot parse is a JSON error
    body: ``431 headers_too_large`` for headers over its limit, else ``400 bad_http``."""

    def send_400_response(self, msg: str) -> None:
        import h11

        limit = self.config.h11_max_incomplete_event_size or DEFAULT_MAX_INCOMPLETE_EVENT_SIZE
        if len(self.conn.trailing_data[0]) > limit:
            status, code = 431, "headers_too_large"
            msg = f"the request headers pass {limit} bytes"
        else:
            status, code = 400, "bad_http"
        headers = [(b"content-type", b"application/json"), (b"connection", b"close")]
        for event in (
            h11.Response(status_code=status, headers=headers),
            h11.Data(data=json_bytes(error_body(code, msg))),
            h11.EndOfMessage(),
        ):
            self.transport.write(self.conn.send(event))
        self.transport.close()
