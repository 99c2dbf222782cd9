"""A rollout backend for verl on the CPU: ``actor_rollout_ref.rollout.name=mcgpo_cpu``.

verl's trainer only generates through rollout replicas looked up by name in
``RolloutReplicaRegistry`` (``workers/rollout/replica.py``) with a matching server adapter
in ``_ROLLOUT_REGISTRY`` (``workers/rollout/base.py``); it ships vLLM, SGLang and
TRT-LLM, all GPU builds. This backend is registered the way verl's extension guide
registers ``vexact`` (docs/extend_guide.rst of verl-project/verl):

* :class:`CpuTokenServer`: one Ray actor per replica (named ``mcgpo_cpu_server_{rank}``)
  holding a Hugging Face causal LM on the CPU; ``generate`` samples with mcgpo's own
  sampler (:func:`mcgpo.rollout.sampler.sample`) and returns verl's ``TokenOutput``
  (token ids and their log-probs). Sleep, wake-up and cache calls are no-ops.
* :class:`CpuReplica`: launches that actor (hybrid, colocated or standalone mode).
* :class:`CpuServerAdapter`: lives in each actor worker; verl's naive weight sync
  (``ActorRolloutRefWorker.update_weights``) hands it the trainer's full parameters,
  which rank 0 of each replica sends to its server (``load_weights``).

Sampling honours ``temperature``, ``max_tokens`` (default ``rollout.response_length``)
and ``stop`` strings; ``top_p < 1`` or ``top_k > 0`` is refused (mcgpo's sampler has
neither). For tests and CPU smoke runs; docs/integrations/verl.md.

State file: with ``MCGPO_CPU_SERVER_STATE=<folder>`` in the environment of the process that
launches the replicas (verl forwards ``ray_kwargs.ray_init.runtime_env.env_vars`` to every
Ray worker), each server keeps ``<folder>/mcgpo_cpu_server_<rank>.json`` current with its
:meth:`CpuTokenServer.state` (requests served, weight version, parameter checksum):
written when the model is loaded and after every ``generate`` and ``load_weights``,
through a temporary file and ``os.replace``, so a reader never sees a partial file. A
driver that runs verl's own ``main_ppo`` (the replicas live in its Ray workers) reads the
servers' final state there.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import ray
import torch
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica, TokenOutput

from mcgpo.rollout.sampler import sample
from mcgpo.training.atomic_files import atomic_write_text

__all__ = [
    "ROLLOUT_NAME",
    "STATE_ENV",
    "CpuReplica",
    "CpuServerAdapter",
    "CpuTokenServer",
    "server_name",
    "state_file",
]


ROLLOUT_NAME = "mcgpo_cpu"
STATE_ENV = "MCGPO_CPU_SERVER_STATE"


def server_name(replica_rank: int) -> str:
    """The Ray actor name of a replica's server."""
    return f"{ROLLOUT_NAME}_server_{replica_rank}"


def state_file(replica_rank: int, folder: str | os.PathLike | None = None) -> Path | None:
    """Where replica ``replica_rank``'s server writes its state: ``<folder>/<server name>.json``
    with ``folder`` (default: ``$MCGPO_CPU_SERVER_STATE``); None when neither is set."""
    folder = folder if folder is not None else os.environ.get(STATE_ENV) or None
    return None if folder is None else Path(folder) / f"{server_name(replica_rank)}.json"


def _model_path(model_config: Any) -> str:
    local = model_config.get("local_path", None) if hasattr(model_config, "get") else None
    return str(local or model_config.path)


def _checksum(model: Any) -> float:
    """The sum of every parameter, in float64 (tied weights once)."""
    return sum(float(p.detach().double().sum()) for p in model.parameters())


class CpuTokenServer:
    """Token-in, token-out generation with a causal LM on the CPU (a Ray actor).

    ``state_path``: the JSON file kept current with :meth:`state` (module docstring);
    None: no file."""

    state_path: Path | None = None
    _checksum: float | None = None  # of the weights as loaded; None: compute on demand
    weight_loads = 0  # load_weights calls

    def __init__(
        self, model_path: str, response_length: int, seed: int = 0,
        state_path: str | os.PathLike | None = None,
    ) -> None:  # fmt: skip
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.set_num_threads(1)
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
        self.response_length = int(response_length)
        self.generator = torch.Generator().manual_seed(seed)
        self.lock = asyncio.Lock()
        self.global_steps: int | None = None
        self.requests = 0
        self._checksum = _checksum(self.model)
        self.state_path = None if state_path is None else Path(state_path)
        if self.state_path is not None:
            self.state_path.parent.mkdir(parents=True, exist_ok=True)
        self._write_state()

    def _sample(self, prompt_ids: list[int], params: dict[str, Any]) -> TokenOutput:
        if float(params.get("top_p", 1.0)) < 1.0 or int(params.get("top_k", -1)) > 0:
            raise ValueError(
                f"{ROLLOUT_NAME}: top_p/top_k sampling is not supported "
                f"(got top_p={params.get('top_p')}, top_k={params.get('top_k')})"
            )
        limit = params.get("max_tokens") or params.get("max_new_tokens") or self.response_length
        out = sample(
            self.model, [list(prompt_ids)], temperature=float(params.get("temperature", 1.0)),
            max_new_tokens=int(limit), eos_token_id=self.tokenizer.eos_token_id,
            stop_strings=tuple(params.get("stop") or ()), tokenizer=self.tokenizer,
            generator=self.generator,
        )  # fmt: skip
        return TokenOutput(
            token_ids=out.response_ids[0], log_probs=out.log_probs[0], stop_reason="completed",
            extra_fields={"global_steps": self.global_steps},
        )  # fmt: skip

    async def generate(
        self, request_id: str = "", *, prompt_ids: list[int], sampling_params: dict[str, Any],
        **kwargs: Any,
    ) -> TokenOutput:  # fmt: skip
        async with self.lock:
            self.requests += 1
            out = await asyncio.to_thread(self._sample, prompt_ids, dict(sampling_params))
            self._write_state()
            return out

    async def load_weights(self, named: list[tuple[str, torch.Tensor]], global_steps: Any) -> int:
        """Copy ``(name, tensor)`` pairs into the model; an unknown name is a KeyError.

        Names are the model's ``state_dict`` keys, tied weights (``lm_head.weight``) included.
        """
        params = self.model.state_dict(keep_vars=True)
        async with self.lock:
            with torch.no_grad():
                for name, tensor in named:
                    if name not in params:
                        raise KeyError(f"{ROLLOUT_NAME}: the server model has no parameter {name}")
                    params[name].copy_(tensor.to(params[name].dtype))
            self.global_steps = global_steps
            self._checksum = _checksum(self.model)
            self.weight_loads += 1
            self._write_state()
        return len(named)

    def _state(self) -> dict[str, Any]:
        if self._checksum is None:
            self._checksum = _checksum(self.model)
        return {
            "requests": self.requests, "global_steps": self.global_steps,
            "checksum": self._checksum, "weight_loads": self.weight_loads,
        }  # fmt: skip

    def _write_state(self) -> None:
        if self.state_path is not None:
            atomic_write_text(self.state_path, json.dumps(self._state()))

    async def state(self) -> dict[str, Any]:
        """What tests read: requests served, the weights' step, a parameter checksum (of
        the weights as last loaded) and how many times ``load_weights`` ran."""
        return self._state()

    async def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = global_steps
        self._write_state()

    async def _noop(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return {}

    wake_up = sleep = clear_kv_cache = release_kv_cache = resume_kv_cache = _noop
    abort_all_requests = resume_generation = start_profile = stop_profile = _noop
    wait_for_requests_to_drain = _noop


class CpuReplica(RolloutReplica):
    """One :class:`CpuTokenServer` per replica, whatever the rollout mode."""

    async def launch_servers(self) -> None:
        server = (
            ray.remote(CpuTokenServer)
            .options(name=server_name(self.replica_rank), max_concurrency=self.max_concurrency)
            .remote(
                model_path=_model_path(self.model_config),
                response_length=int(self.config.response_length),
                seed=int(getattr(self.config, "seed", 0) or 0) + self.replica_rank,
                state_path=state_file(self.replica_rank),
            )
        )
        await server.state.remote()  # wait for the model to load
        self.servers = [server]
        self._server_handle = server
        self._server_address = f"{ROLLOUT_NAME}-{self.replica_rank}"

    def rollout_worker_use_gpu(self) -> bool:
        return False


class CpuServerAdapter(BaseRollout):
    """The rollout side of a hybrid actor worker: forwards weight updates to the server."""

    def __init__(self, config: Any, model_config: Any, device_mesh: Any, *args: Any,
                 **kwargs: Any) -> None:  # fmt: skip
        super().__init__(config, model_config, device_mesh)
        world = (
            self.config.tensor_model_parallel_size
            * self.config.data_parallel_size
            * self.config.pipeline_model_parallel_size
        )
        rank = int(os.environ.get("RANK", 0))
        self.replica_rank, self.rollout_rank = rank // world, rank % world

    async def update_weights(self, weights: Iterable[Any], wire_format: str = "named_tensors",
                             **kwargs: Any) -> None:  # fmt: skip
        if wire_format != "named_tensors":
            raise ValueError(f"{ROLLOUT_NAME}: weight wire format {wire_format!r} not supported")
        # every rank iterates: FSDP gathers each full tensor collectively
        named = [(name, t.detach().to("cpu", copy=True)) for name, t in weights]
        if self.rollout_rank == 0:
            server = ray.get_actor(server_name(self.replica_rank))
            await server.load_weights.remote(named, kwargs.get("global_steps"))

    async def resume(self, tags: list[str]) -> None: ...

    async def release(self) -> None: ...
