"""The JSON of the environment protocol over HTTP: bodies, their checks, the error shape.

Both ends use these functions, so what the server sends is what the client rebuilds: an
:class:`~mcgpo.envs.protocol.Observation` becomes ``{"text", "task", "admissible_actions",
"context": {anchor, state, state_coarse, progress, enabled, progress_value}, "task_type"}``
and a :class:`~mcgpo.envs.protocol.StepResult` ``{"observation", "reward", "done", "info"}``
(docs/envs/serving.md lists every endpoint and body). Only JSON crosses the wire: nothing
a client sends is unpickled or run.

Request bodies are checked field by field; a bad one raises :class:`WireError`, whose
``status`` (4xx), ``code`` and one-line ``message`` (naming the field) make the error body
``{"error": {"code": ..., "message": ...}}``.
"""

from __future__ import annotations

import json
import numbers
from collections.abc import Mapping
from typing import Any

from mcgpo.envs.protocol import Context, Observation, StepResult

__all__ = [
    "MAX_DEPTH",
    "MAX_MESSAGE",
    "PROTOCOL",
    "TOKEN_HEADER",
    "WireError",
    "check_body",
    "clipped",
    "error_body",
    "json_bytes",
    "observation_from_json",
    "observation_json",
    "step_result_from_json",
    "step_result_json",
]

PROTOCOL = 1  # bumped when a body changes shape; /health and /v1/spec report it
TOKEN_HEADER = "X-MCGPO-Token"  # the shared secret, when the server has one
_CONTEXT_FIELDS = ("anchor", "state", "state_coarse", "progress", "enabled")
MAX_MESSAGE = 500  # characters of a message the server stores or echoes (longer ones are cut)
MAX_DEPTH = 32  # levels of nesting a request body may have
_TOO_DEEP = f"the body nests deeper than {MAX_DEPTH} levels"


def clipped(text: str, limit: int = MAX_MESSAGE) -> str:
    """``text``, cut to ``limit`` characters (saying how long it was) when it is longer."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"


class WireError(ValueError):
    """A request the server refuses: HTTP ``status``, a ``code`` and a one-line message."""

    def __init__(self, status: int, code: str, message: str) -> None:
        message = clipped(message)  # it may echo what a client sent
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def error_body(code: str, message: str, **extra: Any) -> dict[str, Any]:
    """``{"error": {"code": code, "message": message, **extra}}``."""
    return {"error": {"code": code, "message": message, **extra}}


def _plain(value: Any) -> Any:
    """``json.dumps`` default: numpy scalars and arrays (``tolist``), sets (sorted)."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def json_bytes(body: Any) -> bytes:
    """Compact UTF-8 JSON; TypeError naming the type for a value JSON cannot hold."""
    return json.dumps(body, default=_plain, ensure_ascii=False, separators=(",", ":")).encode()


def observation_json(obs: Observation) -> dict[str, Any]:
    ctx = obs.context
    return {
        "text": obs.text,
        "task": obs.task,
        "admissible_actions": list(obs.admissible_actions),
        "context": {
            **{name: getattr(ctx, name) for name in _CONTEXT_FIELDS},
            "progress_value": float(ctx.progress_value),
        },
        "task_type": obs.task_type,
    }


def step_result_json(res: StepResult) -> dict[str, Any]:
    return {
        "observation": observation_json(res.observation),
        "reward": float(res.reward),
        "done": bool(res.done),
        "info": dict(res.info),
    }


def observation_from_json(body: Any, where: str = "observation") -> Observation:
    """The Observation of a server's JSON; ValueError naming the field when it is malformed."""
    obj = _object(body, where)
    ctx = _object(obj.get("context", {}), f"{where}.context")
    actions = obj.get("admissible_actions")
    if not isinstance(actions, list) or not all(isinstance(a, str) for a in actions):
        raise ValueError(f"{where}.admissible_actions: expected a list of strings")
    return Observation(
        text=_string(obj, "text", where),
        task=_string(obj, "task", where),
        admissible_actions=tuple(actions),
        context=Context(
            **{name: _string(ctx, name, f"{where}.context", "") for name in _CONTEXT_FIELDS},
            progress_value=_number(ctx, "progress_value", f"{where}.context", 0.0),
        ),
        task_type=_string(obj, "task_type", where, ""),
    )


def step_result_from_json(body: Any) -> StepResult:
    """The StepResult of a server's JSON; ValueError naming the field when it is malformed."""
    obj = _object(body, "step result")
    done = obj.get("done")
    if not isinstance(done, bool):
        raise ValueError("step result.done: expected true or false")
    return StepResult(
        observation=observation_from_json(obj.get("observation"), "step result.observation"),
        reward=_number(obj, "reward", "step result"),
        done=done,
        info=dict(_object(obj.get("info"), "step result.info")),
    )


def _object(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{where}: expected a JSON object, got {_kind(value)}")
    return value


def _string(obj: Mapping[str, Any], key: str, where: str, default: str | None = None) -> str:
    value = obj.get(key, default)
    if not isinstance(value, str):
        raise ValueError(f"{where}.{key}: expected a string, got {_kind(value)}")
    return value


def _number(obj: Mapping[str, Any], key: str, where: str, default: float | None = None) -> float:
    value = obj.get(key, default)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{where}.{key}: expected a number, got {_kind(value)}")
    return float(value)


def _kind(value: Any) -> str:
    """The JSON name of a value's type, for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, numbers.Integral):
        return "an integer"
    if isinstance(value, numbers.Real):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


# What each request body holds: field -> (JSON type check, type name, required)
_KINDS: dict[str, tuple[Any, str]] = {
    "string": (lambda v: isinstance(v, str), "a string"),
    "integer": (
        lambda v: isinstance(v, int) and not isinstance(v, bool),
        "an integer",
    ),
    "object": (lambda v: isinstance(v, dict), "an object"),
}


def check_body(raw: bytes, fields: Mapping[str, tuple[str, bool]]) -> dict[str, Any]:
    """The request's JSON object, checked against ``fields`` (name -> (kind, required)).

    WireError 400 for bytes that are not JSON (``bad_json``), a body that is not an object,
    a missing or unknown field, or a value of the wrong type (``bad_request``), each naming
    what is wrong, and for JSON nested deeper than :data:`MAX_DEPTH` (``bad_json``). An empty
    body is an empty object.
    """
    if not raw.strip():
        body: Any = {}
    else:
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as err:
            raise WireError(400, "bad_json", f"the body is not valid JSON: {err}") from None
        except RecursionError:  # deeper than the parser's own limit
            raise WireError(400, "bad_json", _TOO_DEEP) from None
        if _depth(body) > MAX_DEPTH:
            raise WireError(400, "bad_json", _TOO_DEEP)
    if not isinstance(body, dict):
        raise WireError(400, "bad_request", f"the body must be a JSON object, got {_kind(body)}")
    unknown = sorted(set(body) - set(fields))
    if unknown:
        raise WireError(
            400,
            "bad_request",
            f"unknown field {unknown[0]!r}; this endpoint takes {', '.join(fields) or 'none'}",
        )
    for name, (kind, required) in fields.items():
        if name not in body:
            if required:
                raise WireError(400, "bad_request", f"missing field {name!r} ({kind})")
            continue
        ok, spelled = _KINDS[kind]
        if not ok(body[name]):
            raise WireError(
                400,
                "bad_request",
                f"field {name!r}: expected {spelled}, got {_kind(body[name])}",
            )
    seed = body.get("seed")
    if isinstance(seed, int) and not -(2**63) <= seed < 2**63:
        raise WireError(400, "bad_request", "field 'seed': out of the 64-bit integer range")
    return body


def _depth(value: Any) -> int:
    """Levels of nesting of a parsed JSON value (a scalar is 0), counted without recursion;
    stops counting past :data:`MAX_DEPTH`."""
    deepest, todo = 0, [(value, 0)]
    while todo:
        item, level = todo.pop()
        if isinstance(item, (dict, list)):
            level += 1
            deepest = max(deepest, level)
            if level > MAX_DEPTH:
                return level
            todo.extend((v, level) for v in (item.values() if isinstance(item, dict) else item))
    return deepest
