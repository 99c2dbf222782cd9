"""``remote``: an environment served by ``mcgpo env serve``, behind the env protocol.

    make_env("remote", url="http://127.0.0.1:8765", remote_name="webshop", **options)
    mcgpo train --env.name remote --env.url http://127.0.0.1:8765 --env.remote_name webshop

Observations, admissible actions, rewards, ``info`` and the context MCGPO matches on arrive
exactly as the served environment made them (:mod:`mcgpo.envs.serving.wire`). Options other
than the client's own (``url``, ``remote_name``, ``token_file``, ``connect_timeout``,
``retries``) are the served environment's: the server checks they are the ones it runs with,
so the same seeds and actions give the same episodes as the local environment.

The HTTP client is httpx, one connection pool per process and server (keep-alive, at most
:data:`MAX_CONNECTIONS` connections). The server's step timeout bounds every environment call
(it answers 504 itself); the client waits that long plus :data:`READ_MARGIN` seconds.

**Retries only where they are safe.** Opening a session (its id is chosen here, so opening
twice is opening once) and a reset (its seed fixes the episode) are retried ``retries`` times
when the server cannot be reached, and a reset whose session the server no longer knows (it
was restarted) opens a new one. A step is never retried: a lost answer might be a step the
server applied. A step or expert call that fails raises an :class:`EnvServerError` and the
episode is lost (:class:`~mcgpo.envs.pool.EnvPool` marks the trajectory errored, as it does
for a crashed worker); the next reset starts a new session.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
import weakref
from collections.abc import Mapping
from typing import Any

import httpx

from mcgpo.envs.protocol import Observation, StepResult
from mcgpo.envs.serving.wire import (
    PROTOCOL,
    TOKEN_HEADER,
    observation_from_json,
    step_result_from_json,
)

__all__ = [
    "MAX_CONNECTIONS",
    "READ_MARGIN",
    "EnvCrashed",
    "EnvServerError",
    "EnvServerLost",
    "EnvStepTimeout",
    "RemoteEnv",
    "RemoteEnvError",
]

MAX_CONNECTIONS = 256
READ_MARGIN = 30.0  # seconds past the server's step timeout before the client gives up
TOKEN_ENV = "MCGPO_ENV_TOKEN"  # the token, when no token_file is given


class EnvServerError(RuntimeError):
    """An environment call through the server failed; the episode is lost."""


class EnvServerLost(EnvServerError):
    """The server could not be reached, or did not answer in time."""


class EnvStepTimeout(EnvServerError):
    """The served environment ran past the server's step timeout (the server answered 504)."""


class EnvCrashed(EnvServerError):
    """The served environment's worker process died (the server answered 502)."""


class RemoteEnvError(ValueError):
    """The server refused the request (a 4xx: a bad option, an unknown env, server full...)."""


_FAILURES = {"env_timeout": EnvStepTimeout, "env_crash": EnvCrashed}
_clients: dict[tuple[int, str, str], httpx.Client] = {}
_specs: dict[tuple[str, str, str], dict[str, Any]] = {}
_lock = threading.Lock()


def _token(token_file: str | None) -> str:
    from mcgpo.envs.serving.security import check_token, read_token

    if token_file:
        return read_token(str(token_file))
    token = os.environ.get(TOKEN_ENV, "")
    if token:
        check_token(token, f"${TOKEN_ENV}")
    return token


def _client(url: str, token: str, connect_timeout: float) -> httpx.Client:
    """This process's pooled client for a server (a forked or spawned child makes its own)."""
    key = (os.getpid(), url, token)
    with _lock:
        if key not in _clients:
            _clients[key] = httpx.Client(
                base_url=url,
                headers={TOKEN_HEADER: token} if token else {},
                timeout=httpx.Timeout(connect_timeout + READ_MARGIN, connect=connect_timeout),
                limits=httpx.Limits(
                    max_connections=MAX_CONNECTIONS, max_keepalive_connections=MAX_CONNECTIONS
                ),
            )
        return _clients[key]


def _error_of(response: httpx.Response) -> tuple[str, str]:
    """(code, message) of a server's error body, or the status line for anything else."""
    try:
        err = response.json()["error"]
        return str(err["code"]), str(err["message"])
    except (ValueError, KeyError, TypeError):
        return f"http_{response.status_code}", f"HTTP {response.status_code}"


class RemoteEnv:
    """A served environment; see the module docstring."""

    concurrent_steps = True  # EnvPool may step several of these at once, from threads

    def __init__(
        self,
        url: str,
        remote_name: str | None = None,
        *,
        token_file: str | None = None,
        connect_timeout: float = 10.0,
        retries: int = 3,
        **options: Any,
    ) -> None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"remote env: url must start with http:// or https://, got {url!r}")
        if not isinstance(remote_name, str) or not remote_name:
            raise ValueError(
                "remote env: remote_name must name the served environment "
                "(--env.remote_name NAME, e.g. webshop: what `mcgpo env serve --env` runs)"
            )
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"remote env: retries must be an integer >= 0, got {retries!r}")
        self.url = url.rstrip("/")
        self.remote_name = remote_name
        self.options = dict(options)
        self.retries = retries
        self._token = _token(token_file)
        self._http = _client(self.url, self._token, float(connect_timeout))
        self._timeout: httpx.Timeout | None = None  # the client's default until the spec is read
        spec = self._spec()
        self.step_timeout = float(spec["step_timeout"])
        self.max_turns = int(spec["max_turns"])
        self._timeout = httpx.Timeout(self.step_timeout + READ_MARGIN, connect=connect_timeout)
        self._session: str | None = None
        self._opening: str | None = None  # the id of a session being opened
        self._finalizer = weakref.finalize(self, _close_quietly, self._http, [None])

    # ------------------------------------------------------------------ protocol
    def reset(self, seed: int = 0, split: str = "train") -> Observation:
        """Start the task (seed, split) in this env's session (opened or reopened as needed);
        retried while the server is unreachable or full (a reset with its seed, and opening
        a session under an id chosen here, are safe to repeat)."""
        body = {"seed": seed, "split": split}
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            try:
                if self._session is None and not self._open(last):
                    _backoff(attempt)
                    continue
                response = self._post(f"/v1/sessions/{self._session}/reset", body)
            except EnvServerLost:
                if last:
                    raise
                _backoff(attempt)
                continue
            if response.status_code in (404, 410) and not last:  # restarted, or ended it
                self._session = None
                continue
            return observation_from_json(self._checked(response)["observation"])
        raise EnvServerLost(f"{self.url}: reset of seed {seed} failed {self.retries + 1} times")

    def step(self, action: str) -> StepResult:
        """One step; never retried (module docstring). EnvServerError: the episode is lost."""
        if self._session is None:
            raise RemoteEnvError("remote env: step before reset")
        response = self._post(f"/v1/sessions/{self._session}/step", {"action": action})
        return step_result_from_json(self._checked(response))

    def expert_action(self) -> str:
        if self._session is None:
            raise RemoteEnvError("remote env: expert_action before reset")
        response = self._send("GET", f"/v1/sessions/{self._session}/expert", None)
        action = self._checked(response).get("action")
        if not isinstance(action, str):
            raise EnvServerError(f"{self.url}: expert answer has no action string")
        return action

    def close(self) -> None:
        """Close this env's session on the server (idempotent; errors are ignored)."""
        self._session = None
        self._finalizer()

    # ------------------------------------------------------------------ HTTP
    def _spec(self) -> dict[str, Any]:
        """The server's /v1/spec, checked against this env's name; cached per process."""
        key = (self.url, self.remote_name, self._token)
        spec = _specs.get(key)
        if spec is None:
            for attempt in range(self.retries + 1):
                try:
                    response = self._send("GET", "/v1/spec", None)
                    break
                except EnvServerLost as err:
                    if attempt == self.retries:
                        raise ValueError(
                            f"remote env: {err} (is `mcgpo env serve` running there?)"
                        ) from None
                    _backoff(attempt)
            spec = self._checked(response, refuse=ValueError)
            if spec.get("protocol") != PROTOCOL:
                raise ValueError(
                    f"remote env: {self.url} speaks protocol {spec.get('protocol')!r}, "
                    f"this client {PROTOCOL}"
                )
            if spec.get("env") != self.remote_name:
                raise ValueError(
                    f"remote env: {self.url} serves {spec.get('env')!r}, not {self.remote_name!r}"
                )
            _specs[key] = spec
        served = spec.get("options") or {}
        if dict(served) != self.options:
            first = sorted(
                k
                for k in set(served) | set(self.options)
                if served.get(k, ...) != self.options.get(k, ...)
            )[0]
            here = repr(self.options[first]) if first in self.options else "left at its default"
            there = repr(served[first]) if first in served else "left at its default"
            raise ValueError(
                f"remote env: option {first!r} is {here} here but {there} on {self.url}: "
                "the client asks for the options the server was started with "
                f"(`mcgpo env serve` runs {dict(served) or 'no options'})"
            )
        return spec

    def _open(self, last: bool) -> bool:
        """Open a session (the same id until one is open: opening is idempotent); False when
        the server is full or draining and this is not the ``last`` attempt."""
        session = self._opening = self._opening or uuid.uuid4().hex
        body = {"session": session, "env": self.remote_name, "options": self.options}
        response = self._post("/v1/sessions", body)
        if response.status_code == 503 and not last:
            return False
        self._checked(response)
        self._session, self._opening = session, None
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _close_quietly, self._http, [session])
        self._finalizer.atexit = False  # at exit the server's idle timeout closes it
        return True

    def _post(self, path: str, body: Mapping[str, Any]) -> httpx.Response:
        return self._send("POST", path, body)

    def _send(self, method: str, path: str, body: Mapping[str, Any] | None) -> httpx.Response:
        try:
            timeout = httpx.USE_CLIENT_DEFAULT if self._timeout is None else self._timeout
            return self._http.request(method, path, json=body, timeout=timeout)
        except httpx.TimeoutException as err:
            raise EnvServerLost(f"{self.url}{path}: no answer ({type(err).__name__})") from None
        except httpx.TransportError as err:
            raise EnvServerLost(f"{self.url}{path}: {type(err).__name__}: {err}") from None

    def _checked(
        self, response: httpx.Response, refuse: type[Exception] = RemoteEnvError
    ) -> dict[str, Any]:
        """The JSON of a 2xx answer; else the error the server named, as an exception."""
        if response.is_success:
            try:
                body = response.json()
            except ValueError:
                raise EnvServerError(f"{self.url}: the answer is not JSON") from None
            if not isinstance(body, dict):
                raise EnvServerError(f"{self.url}: the answer is not a JSON object")
            return body
        code, message = _error_of(response)
        if response.status_code >= 500 or code.startswith("env_"):
            if code.startswith("env_"):
                self._session = None  # the server ended it
            raise _FAILURES.get(code, EnvServerError)(f"{code}: {message}")
        raise refuse(f"remote env: {code}: {message}")


def _backoff(attempt: int) -> None:
    """Wait before retry ``attempt + 1``: 0.5, 1, 2, 4, 5, 5 ... seconds."""
    time.sleep(min(0.5 * 2.0**attempt, 5.0))


def _close_quietly(http: httpx.Client, session: list[str | None]) -> None:
    """DELETE a session; nothing is raised (used at close and when an env is collected)."""
    if session[0] is None:
        return
    try:
        http.delete(f"/v1/sessions/{session[0]}", timeout=5.0)
    except Exception:  # the server may be gone: its idle timeout closes the session
        return
