"""The ``mcgpo_env`` agent loop: one mcgpo environment episode per verl sample.

verl runs ``rollout.n`` sessions of each prompt row; here a session is one trajectory of
the row's task, so the N sessions of a row are its N siblings (``group`` = the row's
``uid``, ``slot`` = ``session_id``, ``traj`` = ``"{uid}_{session_id}"``). The task is
``(seed, split)``: ``extra_info["seed"]`` of the row (else the row's ``index``) and
``extra_info["split"]`` (else ``mcgpo.env.train_split``).

Each turn renders the prompt with mcgpo's prompt layer (:func:`mcgpo.rollout.prompts.prompt_ids`:
same templates, history and token budget as mcgpo's own rollout), asks verl's server
manager for one response, parses the action with :func:`mcgpo.rollout.parsing.parse_action`
and steps the session's environment.

**Sampling parameters.** verl's dict (temperature, top_p, top_k, repetition_penalty,
logprobs) goes to the rollout server with the response format's stop strings added, and
the key that keeps a matched stop string in the output, spelled for the backend
``actor_rollout_ref.rollout.name`` (:data:`KEEP_STOP`): ``include_stop_str_in_output`` for
vLLM, ``no_stop_trim`` for SGLang, nothing for ``mcgpo_cpu`` (mcgpo's sampler keeps it
anyway). verl's servers build the engine's ``SamplingParams(**dict)``, so an unknown key
fails every request; another backend is refused when the loop is built (ConfigError).

**Environments.** Each session leases one environment (a one-slot
:class:`mcgpo.envs.pool.EnvPool`) from a cache kept per process and per environment
config (:class:`EnvLeases`): a session resets it to its task, and gives it back for the
next session when its trajectory did not error (an environment that failed is closed). With
``workers = W > 0`` (the shipped configs set it, with ``step_timeout``) each environment
lives in its own worker process (:meth:`EnvPool.in_workers`), at most W processes per
agent-loop worker (a session waits for a free one): a reset or step past
``mcgpo.env.step_timeout`` seconds, or one that kills its process (``os.abort``, a
segfault), costs that trajectory only, exactly as in mcgpo's own rollout. With
``mcgpo.env.workers = 0`` the environments live in this process, stepped in threads: fast,
but a hung step hangs its session and a crash kills the agent-loop worker.

**A served environment** (``mcgpo.env: {name: remote, url: ..., remote_name: ...}``, an
environment that ``mcgpo env serve`` runs on another host or in another venv;
docs/envs/serving.md) is already isolated by its server, with the server's step timeout:
its clients live in this process whatever ``workers`` says, one session each, and a lost
server, a timed-out step or a crashed server-side worker costs the trajectory and is
counted (``env_timeouts`` / ``env_crashes``) like a local worker's.

**Errored trajectories.** A reset or step that raises, times out or crashes ends the
trajectory: the turns before it are returned with ``errored = True`` and the trainer does
not learn from them; a failed reset, or a failure at the first step, returns no output
(verl logs "Empty output"). Every failure is counted in three integer ``extra_fields``,
``env_timeouts``, ``env_crashes`` and ``env_errors`` (a raised exception or a bad return
value), set on every output and nonzero only on a trajectory's last one, so that their
sums over the (non-padding) rows of a batch are the failure counts. A session that
returns no output cannot carry its count: it is held in this process and added to the last
output of the next session here that returns one (:func:`unreported_failures`).

The loop returns one :class:`AgentLoopOutput` per environment step; its ``extra_fields``
hold that step's StepTable fields (:data:`mcgpo.integrations.verl.batch.STEP_FIELDS`),
with ``success`` and ``score`` the trajectory's, set when it ends. The final output's
``reward_score`` is the trajectory's return (verl copies it to the other outputs; mcgpo's
estimators read the per-step ``reward`` field instead), its ``reward_extra_info`` the
episode's outcome for validation's ``eval/*`` (:func:`~mcgpo.integrations.verl.validation.
episode_info`), and an errored trajectory's last output carries the error (``env_error``).

**Trainers.** The loop refuses to be built under any verl trainer but the plugin's own
(:func:`~mcgpo.integrations.verl.config.check_trainer`): under verl's own trainers it is
the plugin's first code to run.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    register,
)

from mcgpo.envs.pool import EnvPool
from mcgpo.envs.protocol import Observation
from mcgpo.envs.workers import EnvSpec
from mcgpo.integrations.verl.config import check_trainer, plugin_config
from mcgpo.integrations.verl.validation import episode_info
from mcgpo.rollout.parsing import parse_action
from mcgpo.rollout.prompts import default_response_format, prompt_ids, stop_strings
from mcgpo.training.config import ConfigError, EnvConfig

__all__ = [
    "AGENT_LOOP_NAME",
    "FAILURE_FIELDS",
    "KEEP_STOP",
    "EnvLeases",
    "McgpoEnvAgentLoop",
    "env_leases",
    "failure_kind",
    "rollout_sampling_params",
    "unreported_failures",
]

AGENT_LOOP_NAME = "mcgpo_env"
logger = logging.getLogger(__name__)

# The key that keeps a matched stop string in the response, per rollout backend: vLLM 0.24
# SamplingParams.include_stop_str_in_output, SGLang 0.5.12 SamplingParams.no_stop_trim (the
# versions verl 0.9.1 pins); mcgpo_cpu (cpu_replica.ROLLOUT_NAME, not imported here: see
# plugin.py) samples with mcgpo's sampler, which keeps it and reads only the keys it knows.
KEEP_STOP: dict[str, dict[str, Any]] = {
    "vllm": {"include_stop_str_in_output": True},
    "sglang": {"no_stop_trim": True},
    "mcgpo_cpu": {},
}

# extra_fields counting a trajectory's environment failure, by failure_kind()
FAILURE_FIELDS: dict[str, str] = {
    "timeout": "env_timeouts",
    "crash": "env_crashes",
    "error": "env_errors",
}

# EnvPool's one-line messages (mcgpo.envs.pool/_one_line + mcgpo.envs.workers): the phase,
# then what the worker set reports for a job past the timeout or a worker that died, or the
# served environment's client errors (mcgpo.envs.serving.client): the server's 504, or its
# 502 / no answer at all
_PHASE = r"^(?:after )?(?:reset seed -?\d+|step turn \d+): "
_TIMEOUT = re.compile(_PHASE + r"(?:timed out after |EnvStepTimeout: )")
_CRASH = re.compile(_PHASE + r"(?:worker died \(|EnvCrashed: |EnvServerLost: )")
REMOTE_ENV = "remote"  # the served-environment client's name (mcgpo.envs.BUILT_IN)

_ERROR_CHARS = 500  # of an error message kept on the trajectory's last output (env_error)
_ENV_THREADS = 64  # threads that wait on environment calls, per agent-loop worker process
_executor: ThreadPoolExecutor | None = None
# mcgpo.envs.ENVIRONMENTS reads its plugin table lazily and is not thread-safe: a lookup
# while another thread (re)reads it can miss a plugin, so in-process builds take turns
_build_lock = threading.Lock()
_leases: dict[str, EnvLeases] = {}
_unreported: collections.Counter[str] = collections.Counter()


def rollout_sampling_params(
    backend: str, sampling_params: Mapping[str, Any], stops: Sequence[str]
) -> dict[str, Any]:
    """verl's sampling params, plus ``stop`` and the backend's keep-the-stop-string key.

    An unknown ``backend`` (``actor_rollout_ref.rollout.name``) is a ConfigError: its
    server would get keys it may reject or ignore, per request, deep in the engine."""
    if backend not in KEEP_STOP:
        raise ConfigError(
            f"actor_rollout_ref.rollout.name: the {AGENT_LOOP_NAME} agent loop knows the "
            f"sampling parameters of {', '.join(KEEP_STOP)}, not {backend!r}"
        )
    return {**sampling_params, "stop": list(stops), **KEEP_STOP[backend]}


def failure_kind(message: str) -> str:
    """'timeout', 'crash' or 'error': what an EnvPool error message (``pool.errors``) says."""
    if _TIMEOUT.match(message):
        return "timeout"
    if _CRASH.match(message):
        return "crash"
    return "error"


def unreported_failures() -> dict[str, int]:
    """Failures of sessions without output in this process, not yet put on an output."""
    return {FAILURE_FIELDS[kind]: count for kind, count in _unreported.items() if count}


def _threads() -> ThreadPoolExecutor:
    global _executor
    if _executor is None:
        _executor = ThreadPoolExecutor(_ENV_THREADS, thread_name_prefix="mcgpo-env")
    return _executor


class EnvLeases:
    """The environments of one environment config in this process, one per session at a time.

    :meth:`acquire` gives a free one-slot EnvPool, or builds one (in a thread: building in
    a worker process takes a process start); with ``workers > 0`` at most ``workers`` exist
    at once and a session waits for one to be released. :meth:`release` keeps a pool for
    the next session or closes it. Used from one event loop (the agent-loop worker's).
    """

    def __init__(self, env: EnvConfig) -> None:
        self.spec = EnvSpec(env.name, dict(env.options))
        # a served environment's client waits on HTTP; its server isolates the environment
        self.workers = 0 if env.name == REMOTE_ENV else int(env.workers)
        self.step_timeout = float(env.step_timeout)
        self.free: list[EnvPool] = []
        self.leased = 0
        self.built = 0  # pools built so far (tests, monitoring)
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    def _build(self) -> EnvPool:
        if self.workers == 0:
            with _build_lock:
                return EnvPool([self.spec()])
        return EnvPool.in_workers(self.spec, 1, workers=1, step_timeout=self.step_timeout)

    async def acquire(self) -> EnvPool:
        """A pool for one session; the caller must :meth:`release` it."""
        loop = asyncio.get_running_loop()
        while self.workers and self.leased >= self.workers:
            waiter = loop.create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except BaseException:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
                else:  # woken, then cancelled: pass the turn on
                    self._wake()
                raise
        self.leased += 1
        try:
            if self.free:
                return self.free.pop()
            pool = await asyncio.wrap_future(_threads().submit(self._build))
            self.built += 1
            return pool
        except BaseException:
            self.leased -= 1
            self._wake()
            raise

    def release(self, pool: EnvPool, *, reuse: bool, busy: Future | None = None) -> None:
        """Give a pool back: kept for the next session if ``reuse``, else closed (once the
        environment call ``busy``, still running in its thread, has returned)."""
        self.leased -= 1
        if reuse and busy is None:
            self.free.append(pool)
        elif busy is not None and not busy.done():
            busy.add_done_callback(lambda _: pool.close())
        else:
            pool.close()
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def close(self) -> None:
        """Close the free pools (leased ones are closed when released)."""
        while self.free:
            self.free.pop().close()


def env_leases(env: EnvConfig) -> EnvLeases:
    """This process's :class:`EnvLeases` of an environment config (made on first use)."""
    key = json.dumps(
        [env.name, dict(env.options), int(env.workers), float(env.step_timeout)],
        sort_keys=True, default=repr,
    )  # fmt: skip
    if key not in _leases:
        _leases[key] = EnvLeases(env)
    return _leases[key]


@register(AGENT_LOOP_NAME)
class McgpoEnvAgentLoop(AgentLoopBase):
    """verl agent loop over an mcgpo environment; see the module docstring."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        try:  # under verl's own trainers the plugin's first code to run is here
            check_trainer(self.config)
        except ConfigError as err:
            logger.error("%s: %s", AGENT_LOOP_NAME, err)
            raise
        self.mcgpo = plugin_config(self.config)
        fmt = self.mcgpo.rollout.response_format
        self.response_format = default_response_format(self.tokenizer) if fmt == "auto" else fmt
        self.response_length = int(self.rollout_config.response_length)
        self.prompt_length = int(self.rollout_config.prompt_length)
        self.backend = self.rollout_config.get("name", None)
        self.stops = stop_strings(self.response_format)
        rollout_sampling_params(str(self.backend), {}, self.stops)  # an unknown backend fails here
        self._busy: Future | None = None  # the environment call running in a thread

    def _task(self, kwargs: dict[str, Any]) -> tuple[int, str]:
        extra = kwargs.get("extra_info") or {}
        seed = extra.get("seed", kwargs.get("index", 0))
        return int(seed), str(extra.get("split", self.mcgpo.env.train_split))

    async def _env(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` in an environment thread (the worker pool's timeout bounds it)."""
        self._busy = _threads().submit(fn, *args)
        result = await asyncio.wrap_future(self._busy)
        self._busy = None
        return result

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> list[AgentLoopOutput]:
        leases = env_leases(self.mcgpo.env)
        pool = await leases.acquire()
        reuse = False
        try:
            outputs = await self._episode(pool, sampling_params, kwargs)
            reuse = not pool.errored[0]
        finally:
            leases.release(pool, reuse=reuse, busy=self._busy)
        return outputs

    async def _episode(
        self, pool: EnvPool, sampling_params: dict[str, Any], kwargs: dict[str, Any]
    ) -> list[AgentLoopOutput]:
        uid, session = str(kwargs["uid"]), int(kwargs["session_id"])
        traj = f"{uid}_{session}"
        seed, split = self._task(kwargs)
        first = (await self._env(pool.reset, [seed], split))[0]
        if first is None:
            return self._no_output(pool, traj, f"reset of task {split}/{seed}")
        limit = self.mcgpo.env.max_turns or pool.max_turns[0]
        params = rollout_sampling_params(str(self.backend), sampling_params, self.stops)
        ids = {"group": uid, "traj": traj, "slot": session}
        outputs: list[AgentLoopOutput] = []
        past: list[tuple[str, str]] = []
        obs: Observation = first
        info: dict[str, Any] = {}
        ret = 0.0
        for turn in range(limit):
            output, action, valid = await self._respond(obs, past, params)
            results = await self._env(pool.step, {0: action})
            if 0 not in results:  # the environment failed: trajectory errored
                break
            res = results[0]
            ctx, nxt = obs.context, res.observation.context
            ret += float(res.reward)
            info = res.info
            output.extra_fields.update(
                ids, turn=turn, action=action, action_valid=valid, reward=float(res.reward),
                done=bool(res.done), anchor=ctx.anchor, next_anchor=nxt.anchor,
                state=ctx.state, state_coarse=ctx.state_coarse, progress=ctx.progress,
                enabled=ctx.enabled, progress_value=float(ctx.progress_value),
                next_progress_value=float(nxt.progress_value), task_type=obs.task_type,
            )  # fmt: skip
            outputs.append(output)
            past.append((obs.text, action))
            obs = res.observation
            if res.done:
                break
        if not outputs:
            return self._no_output(pool, traj, f"first step of task {split}/{seed}")
        errored = bool(pool.errored[0])
        success = 1.0 if info.get("won", False) and not errored else 0.0
        score = float(info.get("score", 0.0))
        for out in outputs:
            out.extra_fields.update(
                success=success, score=score, errored=errored, env_error="",
                **dict.fromkeys(FAILURE_FIELDS.values(), 0),
            )  # fmt: skip
            out.extra_fields["reward_extra_info"] = {}
        last = outputs[-1].extra_fields
        # the episode's outcome for validation's eval/* (validation.py)
        last["reward_extra_info"] = episode_info(
            success=success, score=score, errored=errored, turns=len(outputs),
            valid_turns=sum(bool(o.extra_fields["action_valid"]) for o in outputs),
            task_type=str(first.task_type or ""),
        )  # fmt: skip
        if errored:
            message = pool.errors.get(0, "")
            logger.warning("%s: trajectory %s errored: %s", AGENT_LOOP_NAME, traj, message)
            last[FAILURE_FIELDS[failure_kind(message)]] += 1
            last["env_error"] = message[:_ERROR_CHARS]
        for kind, count in list(_unreported.items()):  # failures of sessions without output
            last[FAILURE_FIELDS[kind]] += count
            del _unreported[kind]
        outputs[-1].reward_score = ret
        return outputs

    def _no_output(self, pool: EnvPool, traj: str, what: str) -> list[AgentLoopOutput]:
        """The session ends with no output: its failure waits for the next output here."""
        message = pool.errors.get(0, "")
        logger.warning("%s: %s (%s) failed: %s", AGENT_LOOP_NAME, what, traj, message)
        _unreported[failure_kind(message)] += 1
        return []

    async def _respond(
        self, obs: Observation, past: list[tuple[str, str]], params: dict[str, Any]
    ) -> tuple[AgentLoopOutput, str, bool]:
        """One model call: (the step's output without its env fields, action, format valid)."""
        ids, _ = prompt_ids(
            self.tokenizer, obs, past, history=self.mcgpo.rollout.history,
            response_format=self.response_format, max_prompt_tokens=self.prompt_length,
        )  # fmt: skip
        out = await self.server_manager.generate(
            request_id=uuid4().hex, prompt_ids=ids, sampling_params=dict(params)
        )
        response = list(out.token_ids)[: self.response_length]
        logprobs = list(out.log_probs)[: self.response_length] if out.log_probs else None
        text = self.tokenizer.decode(response, skip_special_tokens=True)
        action, valid = parse_action(text, self.response_format)
        # the weights' version, which verl's trainer reads from every output's tags
        steps = out.extra_fields.get("global_steps")
        versions = {
            "min_global_steps": out.extra_fields.get("min_global_steps", steps),
            "max_global_steps": out.extra_fields.get("max_global_steps", steps),
        }
        output = AgentLoopOutput(
            prompt_ids=ids, response_ids=response, response_mask=[1] * len(response),
            response_logprobs=logprobs, num_turns=2, metrics=AgentLoopMetrics(),
            extra_fields=versions,
        )  # fmt: skip
        return output, action, valid
