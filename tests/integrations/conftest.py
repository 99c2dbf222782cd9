"""Fixtures for the verl plugin tests: whole mcgpo_env episodes against a fake verl server.

The server has verl's server-manager interface (``await generate(request_id=...,
prompt_ids=..., sampling_params=...) -> TokenOutput``) and samples from mcgpo's tiny model
with mcgpo's own sampler. Every test here needs the verl extra and skips without it (``importorskip`` in each test
module; this file imports nothing from verl at module level, so collection works without it).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

from mcgpo.policy import tiny_model, train_tokenizer
from mcgpo.rollout import environment_corpus
from mcgpo.rollout.sampler import sample

GROUPS, N, MAX_TURNS = 2, 4, 3


class TinyServer:
    """verl's LLMServerClient.generate, backed by the tiny model (per-token log-probs)."""

    def __init__(self, model: Any, tokenizer: Any) -> None:
        self.model, self.tokenizer, self.calls = model, tokenizer, 0
        self.generator = torch.Generator().manual_seed(0)

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict,
                       **kwargs: Any) -> Any:  # fmt: skip
        from verl.workers.rollout.replica import TokenOutput

        self.calls += 1
        out = sample(
            self.model, [prompt_ids], temperature=float(sampling_params["temperature"]),
            max_new_tokens=8, eos_token_id=self.tokenizer.eos_token_id,
            stop_strings=tuple(sampling_params.get("stop", ())), tokenizer=self.tokenizer,
            generator=self.generator,
        )  # fmt: skip
        return TokenOutput(token_ids=out.response_ids[0], log_probs=out.log_probs[0])


def verl_config(algo: str = "mcgpo", **algo_options: Any) -> Any:
    """The parts of a verl config the plugin reads, plus its ``mcgpo`` block."""
    from omegaconf import OmegaConf

    return OmegaConf.create(
        {
            "actor_rollout_ref": {
                "rollout": {"name": "vllm", "n": N, "prompt_length": 512, "response_length": 8}
            },
            "data": {},
            "trainer": {"use_v1": True, "v1": {"trainer_mode": "mcgpo"}},
            "mcgpo": {
                "env": {"name": "household", "max_turns": MAX_TURNS},
                "rollout": {"history": 1, "response_format": "action"},
                "algo": {"name": algo, **algo_options},
            },
        }
    )


@pytest.fixture(scope="session")
def tiny_policy():
    torch.set_num_threads(1)
    tokenizer = train_tokenizer(environment_corpus(("household",), episodes=4), vocab_size=400)
    return tiny_model(tokenizer, seed=0, hidden_size=32, num_layers=1), tokenizer


@pytest.fixture(scope="session")
def episodes(tiny_policy):
    """(config, server, {(uid, session): outputs}) of GROUPS tasks x N sessions."""
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, _agent_loop_registry

    import mcgpo.integrations.verl.plugin  # noqa: F401  (registered by import verl already)

    model, tokenizer = tiny_policy
    config, server = verl_config(), TinyServer(model, tokenizer)
    target = _agent_loop_registry["mcgpo_env"]["_target_"]
    module, name = target.rsplit(".", 1)
    cls = getattr(__import__(module, fromlist=[name]), name)

    async def play() -> dict:
        out = {}
        for g in range(GROUPS):
            for s in range(N):
                loop = cls(
                    trainer_config=DictConfigWrap(config), server_manager=server,
                    tokenizer=tokenizer, processor=None, dataset_cls=None,
                    data_config=DictConfigWrap(config.data),
                )  # fmt: skip
                kwargs = {"uid": f"uid-{g}", "session_id": s, "index": g, "extra_info": {}}
                out[(f"uid-{g}", s)] = await loop.run({"temperature": 1.0}, **kwargs)
        return out

    return config, server, asyncio.run(play())
