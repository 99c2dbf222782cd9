"""The ``mcgpo_env`` agent loop: one mcgpo environment episode per verl sample.

verl runs ``rollout.n`` sessions of each prompt row; here a session is one trajectory of
the row's task, so the N sessions of a row are its N siblings (``group`` = the row's
``uid``, ``slot`` = ``session_id``, ``traj`` = ``"{uid}_{session_id}"``). The task is
``(seed, split)``: ``extra_info["seed"]`` of the row (else the row's ``index``) and
``extra_info["split"]`` (else ``mcgpo.env.train_split``).

Each turn renders the prompt with mcgpo's prompt layer (:func:`mcgpo.rollout.prompts.prompt_ids`:
same templates, history and token budget as mcgpo's own rollout), asks verl's server
manager for one response, parses the action with :func:`mcgpo.rollout.parsing.parse_action`
and steps the environment through a one-slot :class:`mcgpo.envs.pool.EnvPool`, so an
exception in ``reset``/``step`` marks the trajectory errored exactly as in mcgpo's pool:
the turns before it are returned with ``errored = True`` and the trainer does not learn
from them. A failed ``reset`` returns no output (verl logs "Empty output").

The loop returns one :class:`AgentLoopOutput` per environment step; its ``extra_fields``
hold that step's StepTable fields (:data:`mcgpo.integrations.verl.batch.STEP_FIELDS`),
with ``success`` and ``score`` the trajectory's, set when it ends. The final output's
``reward_score`` is the trajectory's return (verl copies it to the other outputs; mcgpo's
estimators read the per-step ``reward`` field instead).
"""

from __future__ import annotations

import logging
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    register,
)

from mcgpo.envs import make_env
from mcgpo.envs.pool import EnvPool
from mcgpo.envs.protocol import Observation
from mcgpo.integrations.verl.config import plugin_config
from mcgpo.rollout.parsing import parse_action
from mcgpo.rollout.prompts import default_response_format, prompt_ids, stop_strings

__all__ = ["AGENT_LOOP_NAME", "McgpoEnvAgentLoop"]

AGENT_LOOP_NAME = "mcgpo_env"
logger = logging.getLogger(__name__)


@register(AGENT_LOOP_NAME)
class McgpoEnvAgentLoop(AgentLoopBase):
    """verl agent loop over an mcgpo environment; see the module docstring."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.mcgpo = plugin_config(self.config)
        fmt = self.mcgpo.rollout.response_format
        self.response_format = default_response_format(self.tokenizer) if fmt == "auto" else fmt
        self.response_length = int(self.rollout_config.response_length)
        self.prompt_length = int(self.rollout_config.prompt_length)

    def _task(self, kwargs: dict[str, Any]) -> tuple[int, str]:
        extra = kwargs.get("extra_info") or {}
        seed = extra.get("seed", kwargs.get("index", 0))
        return int(seed), str(extra.get("split", self.mcgpo.env.train_split))

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> list[AgentLoopOutput]:
        uid, session = str(kwargs["uid"]), int(kwargs["session_id"])
        env_cfg = self.mcgpo.env
        env = make_env(env_cfg.name, **dict(env_cfg.options))
        pool = EnvPool([env])
        seed, split = self._task(kwargs)
        first = (await self.loop.run_in_executor(None, pool.reset, [seed], split))[0]
        if first is None:
            logger.warning("mcgpo_env: reset of task %s/%s failed: %s", split, seed, pool.errors)
            return []
        limit = env_cfg.max_turns or pool.max_turns[0]
        params = {
            **sampling_params,
            "stop": list(stop_strings(self.response_format)),
            "include_stop_str_in_output": True,
        }
        ids = {"group": uid, "traj": f"{uid}_{session}", "slot": session}
        outputs: list[AgentLoopOutput] = []
        past: list[tuple[str, str]] = []
        obs: Observation = first
        info: dict[str, Any] = {}
        ret = 0.0
        for turn in range(limit):
            output, action, valid = await self._respond(obs, past, params)
            results = await self.loop.run_in_executor(None, pool.step, {0: action})
            if 0 not in results:  # the environment raised: trajectory errored
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
        errored = bool(pool.errored[0])
        success = 1.0 if info.get("won", False) and not errored else 0.0
        for out in outputs:
            out.extra_fields.update(
                success=success, score=float(info.get("score", 0.0)), errored=errored
            )
            out.extra_fields["reward_extra_info"] = {}
        if outputs:
            outputs[-1].reward_score = ret
        return outputs

    async def _respond(
        self, obs: Observation, past: list[tuple[str, str]], params: dict[str, Any]
    ) -> tuple[AgentLoopOutput, str, bool]:
        """One model call: (the step's output without its env fields, action, format valid)."""
        ids, _ = prompt_ids(
            self.tokenizer, obs, past, history=self.mcgpo.rollout.history,
            response_format=self.response_format, max_prompt_tokens=self.prompt_length,
        )  # fmt: skip
        out = await self.server_manager.generate(
            request_id=uuid4().hex, prompt_ids=ids, sampling_params=params
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
