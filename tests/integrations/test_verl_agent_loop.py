"""The mcgpo_env agent loop: sampling parameters per rollout backend, environments leased
per session, and the step timeout and crash isolation of environment worker processes."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time

import pytest
import torch

verl = pytest.importorskip("verl")

import faulty_env  # noqa: E402

from conftest import MAX_TURNS, N, TinyServer, verl_config  # noqa: E402
from mcgpo.integrations.verl import agent_loop  # noqa: E402
from mcgpo.training.config import ConfigError  # noqa: E402

pytestmark = pytest.mark.verl

# The dict verl 0.9.1 hands every agent loop (AgentLoopWorkerTQ.generate_sequences in
# verl/trainer/ppo/v1/agent_loop_tq.py, the defaults of the rollout config).
VERL_PARAMS = {
    "temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True,
}  # fmt: skip

# vLLM 0.24.0 (the version verl 0.9.1's `vllm` extra pins): the public fields of
# `class SamplingParams(msgspec.Struct)` in vllm/sampling_params.py, read from the wheel.
VLLM_FIELDS = frozenset({
    "allowed_token_ids", "bad_words", "detokenize", "extra_args", "flat_logprobs",
    "frequency_penalty", "ignore_eos", "include_stop_str_in_output", "logit_bias",
    "logprob_token_ids", "logprobs", "max_tokens", "min_p", "min_tokens", "n", "output_kind",
    "output_text_buffer_length", "presence_penalty", "prompt_logprobs", "repetition_detection",
    "repetition_penalty", "routed_experts_prompt_start", "seed", "skip_clone",
    "skip_reading_prefix_cache", "skip_special_tokens", "spaces_between_special_tokens",
    "stop", "stop_token_ids", "structured_outputs", "temperature", "thinking_token_budget",
    "top_k", "top_p",
})  # fmt: skip
# SGLang 0.5.12 (verl 0.9.1's `sglang` extra): the parameters of SamplingParams.__init__ in
# python/sglang/srt/sampling/sampling_params.py, read from the wheel; TokenizerManager
# builds SamplingParams(**request.sampling_params), so any other key is a TypeError.
SGLANG_FIELDS = frozenset({
    "custom_params", "ebnf", "frequency_penalty", "ignore_eos", "json_schema", "logit_bias",
    "max_new_tokens", "min_new_tokens", "min_p", "n", "no_stop_trim", "presence_penalty",
    "regex", "repetition_penalty", "sampling_seed", "skip_special_tokens",
    "spaces_between_special_tokens", "stop", "stop_regex", "stop_token_ids", "stream_interval",
    "structural_tag", "temperature", "top_k", "top_p",
})  # fmt: skip
# what CpuTokenServer._sample reads (mcgpo/integrations/verl/cpu_replica.py); it ignores
# other keys, so a key outside this set would be dropped silently
CPU_READS = frozenset({"temperature", "top_p", "top_k", "max_tokens", "max_new_tokens", "stop"})


def vllm_engine_keys(sent: dict) -> set[str]:
    """The keys of the SamplingParams verl's vLLM server builds from ``sent``
    (vllm_async_server.py generate, verl 0.9.1): it pops max_tokens / max_new_tokens and
    passes max_tokens, turns logprobs into 0/None, and adds repetition_penalty, ignore_eos
    and (with full_determinism) seed."""
    keys = set(sent) - {"max_tokens", "max_new_tokens"}
    return keys | {"max_tokens", "logprobs", "repetition_penalty", "ignore_eos", "seed"}


def sglang_engine_keys(sent: dict) -> set[str]:
    """The keys of the sampling_params verl's SGLang server puts in its GenerateReqInput
    (async_sglang_server.py generate, verl 0.9.1): max_new_tokens set (max_tokens popped),
    logprobs and prompt_logprobs popped into request-level fields."""
    keys = set(sent) - {"max_tokens", "logprobs", "prompt_logprobs"}
    return keys | {"max_new_tokens"}


class Recording:
    """A server manager that records the sampling params of every request."""

    def __init__(self, inner) -> None:
        self.inner, self.sent = inner, []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        self.sent.append(dict(sampling_params))
        return await self.inner.generate(
            request_id, prompt_ids=prompt_ids, sampling_params=sampling_params, **kwargs
        )


@pytest.fixture(autouse=True)
def fresh_leases():
    """Each test starts without cached environments or unreported failures."""
    agent_loop._unreported.clear()
    yield
    for leases in agent_loop._leases.values():
        leases.close()
    agent_loop._leases.clear()
    agent_loop._unreported.clear()


@pytest.fixture
def faulty(tmp_path, monkeypatch):
    """The faulty-household entry point on sys.path (worker processes get it too)."""
    monkeypatch.syspath_prepend(str(faulty_env.install_entry_point(tmp_path / "site")))
    once = tmp_path / "once"
    once.mkdir()
    return str(once)


def config_with(backend="vllm", **env):
    config = verl_config()
    config.actor_rollout_ref.rollout.name = backend
    config.mcgpo.env.update(env)
    return config


def loop_of(config, server, tokenizer):
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap

    return agent_loop.McgpoEnvAgentLoop(
        trainer_config=DictConfigWrap(config), server_manager=server, tokenizer=tokenizer,
        processor=None, dataset_cls=None, data_config=DictConfigWrap(config.data),
    )  # fmt: skip


def play(config, server, tokenizer, sessions, *, concurrent=True, limit=60.0):
    """{(group, session): outputs} of sessions (g, s) played as verl does: all at once (one
    asyncio task each, on one event loop) or one after the other; the seconds taken."""

    async def one(g, s):
        kwargs = {"uid": f"uid-{g}", "session_id": s, "index": g, "extra_info": {}}
        return await loop_of(config, server, tokenizer).run(dict(VERL_PARAMS), **kwargs)

    async def every():
        if concurrent:
            outs = await asyncio.gather(*(one(g, s) for g, s in sessions))
        else:
            outs = [await one(g, s) for g, s in sessions]
        return dict(zip(sessions, outs))

    start = time.monotonic()
    out = asyncio.run(asyncio.wait_for(every(), limit))
    return out, time.monotonic() - start


def totals(outs) -> dict[str, int]:
    rows = [o.extra_fields for outputs in outs.values() for o in outputs]
    return {name: sum(r[name] for r in rows) for name in agent_loop.FAILURE_FIELDS.values()}


def errored_sessions(outs):
    return {key for key, outputs in outs.items() if any(o.extra_fields["errored"] for o in outputs)}


# ---- sampling parameters per backend -----------------------------------------------------


@pytest.mark.parametrize(
    ("backend", "engine_keys", "fields", "keep"),
    [
        ("vllm", vllm_engine_keys, VLLM_FIELDS, {"include_stop_str_in_output": True}),
        ("sglang", sglang_engine_keys, SGLANG_FIELDS, {"no_stop_trim": True}),
    ],
)
def test_sampling_params_are_fields_of_the_backends_sampling_params(
    tiny_policy, backend, engine_keys, fields, keep
):
    model, tokenizer = tiny_policy
    server = Recording(TinyServer(model, tokenizer))
    play(config_with(backend), server, tokenizer, [(0, 0)])
    assert server.sent  # one request per turn
    for sent in server.sent:
        assert sent == {**VERL_PARAMS, "stop": ["\n"], **keep}  # "action" format: stop at \n
        assert engine_keys(sent) <= fields, engine_keys(sent) - fields
    # why the key depends on the backend: each engine lacks the other's spelling
    assert "include_stop_str_in_output" not in SGLANG_FIELDS
    assert "no_stop_trim" not in VLLM_FIELDS


def test_the_cpu_backend_gets_only_keys_it_reads_and_samples_with_them(tiny_policy):
    from mcgpo.integrations.verl.cpu_replica import ROLLOUT_NAME, CpuTokenServer

    assert ROLLOUT_NAME == "mcgpo_cpu" and ROLLOUT_NAME in agent_loop.KEEP_STOP
    model, tokenizer = tiny_policy
    # the server's own sampling code, without loading a model from a path
    cpu = CpuTokenServer.__new__(CpuTokenServer)
    cpu.model, cpu.tokenizer, cpu.response_length = model, tokenizer, 8
    cpu.generator, cpu.lock, cpu.global_steps, cpu.requests = (
        torch.Generator(),
        asyncio.Lock(),
        3,
        0,
    )
    server = Recording(cpu)
    outs, _ = play(config_with("mcgpo_cpu"), server, tokenizer, [(0, 0)])
    (outputs,) = outs.values()
    assert cpu.requests == len(server.sent) == len(outputs) > 0
    for sent in server.sent:
        assert sent == {**VERL_PARAMS, "stop": ["\n"]}
        assert set(sent) - set(VERL_PARAMS) <= CPU_READS
    for out in outputs:  # no stop string before a response's last token; the weights' step
        assert "\n" not in tokenizer.decode(out.response_ids[:-1])
        assert out.extra_fields["max_global_steps"] == 3


@pytest.mark.parametrize("backend", ["trtllm", None])
def test_an_unknown_backend_is_refused_when_the_loop_is_built(tiny_policy, backend):
    model, tokenizer = tiny_policy
    config = config_with(backend)
    with pytest.raises(ConfigError, match=(
        r"^actor_rollout_ref.rollout.name: the mcgpo_env agent loop knows the sampling "
        rf"parameters of vllm, sglang, mcgpo_cpu, not '{backend}'$"
    )):  # fmt: skip
        loop_of(config, TinyServer(model, tokenizer), tokenizer)


def test_failure_kind_reads_the_pool_messages():
    kind = agent_loop.failure_kind
    assert kind("step turn 3: timed out after 1.5 s; worker restarted") == "timeout"
    assert kind("reset seed -2: timed out after 60 s; worker restarted") == "timeout"
    assert kind("step turn 2: worker died (exit code -6); worker restarted") == "crash"
    assert kind("after step turn 2: worker died (exit code 3); worker restarted") == "crash"
    # an environment's own exception, even one that says "timed out", is an error
    assert kind("step turn 1: TimeoutError: timed out after 3 s") == "error"
    assert kind("reset seed 4: RuntimeError: worker died (simulated)") == "error"
    assert kind("") == "error"
    # a served environment (mcgpo.envs.serving.client): the server's 504 is a timeout, its
    # 502 or no answer at all a crash, its 500 (the environment raised) an error
    assert (
        kind("step turn 2: EnvStepTimeout: env_timeout: step turn 2: timed out after 60 s")
        == "timeout"
    )
    assert (
        kind("step turn 1: EnvCrashed: env_crash: step turn 1: worker died (exit code 3)")
        == "crash"
    )
    assert (
        kind("step turn 4: EnvServerLost: http://h:1/v1/sessions/x/step: ConnectError") == "crash"
    )
    assert (
        kind("reset seed 3: EnvServerLost: http://h:1/v1/sessions/x/reset: ReadTimeout") == "crash"
    )
    assert kind("step turn 1: EnvServerError: env_error: step turn 1: KeyError: 'x'") == "error"


# ---- environments leased per session -----------------------------------------------------


def test_environments_are_reused_and_a_reused_one_plays_like_a_fresh_one(tiny_policy):
    model, tokenizer = tiny_policy
    config = config_with()
    # task 0 on a fresh environment, then task 1, then task 0 again on the same environment
    fresh, _ = play(config, TinyServer(model, tokenizer), tokenizer, [(0, 0)])
    play(config, TinyServer(model, tokenizer), tokenizer, [(1, 0)])
    again, _ = play(config, TinyServer(model, tokenizer), tokenizer, [(0, 0)])
    leases = agent_loop.env_leases(agent_loop.plugin_config(config).env)
    assert leases.built == 1 and len(leases.free) == 1 and leases.leased == 0
    rows = [[o.extra_fields for o in outs] for outs in (fresh[(0, 0)], again[(0, 0)])]
    assert rows[0] == rows[1] and len(rows[0]) >= 1
    # the same task in a worker process: the same episode
    there, _ = play(config_with(workers=1), TinyServer(model, tokenizer), tokenizer, [(0, 0)])
    assert [o.extra_fields for o in there[(0, 0)]] == rows[0]
    # concurrent sessions hold one environment each, all kept for the next batch
    sessions = [(g, s) for g in range(2) for s in range(N)]
    play(config, TinyServer(model, tokenizer), tokenizer, sessions)
    assert leases.built == len(sessions) == len(leases.free)


def test_workers_cap_the_environment_processes_of_an_agent_loop_worker(tiny_policy):
    model, tokenizer = tiny_policy
    config = config_with(workers=2, step_timeout=5.0)
    sessions = [(g, s) for g in range(2) for s in range(N)]
    leases = agent_loop.env_leases(agent_loop.plugin_config(config).env)
    peak = []
    acquire = leases.acquire

    async def counted():
        pool = await acquire()
        peak.append(leases.leased)
        return pool

    leases.acquire = counted
    outs, _ = play(config, TinyServer(model, tokenizer), tokenizer, sessions)
    assert leases.built == 2 and max(peak) == 2 and len(peak) == len(sessions)
    assert all(1 <= len(o) <= MAX_TURNS for o in outs.values()) and not errored_sessions(outs)
    processes = [p for pool in leases.free for p in pool.processes()]
    assert len(processes) == 2 and all(p.is_alive() for p in processes)


# ---- step timeout and crash isolation ------------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "field", "message"),
    [
        ("hang", "env_timeouts", "step turn 2: timed out after 1 s; worker restarted"),
        ("abort", "env_crashes", "step turn 2: worker died (exit code -6); worker restarted"),
    ],
)
def test_a_hung_or_crashing_step_costs_one_trajectory(
    tiny_policy, faulty, caplog, fault, field, message
):
    model, tokenizer = tiny_policy
    # the first sibling of task 1 to take its 2nd step hangs for 30 s or aborts its process
    config = config_with(
        name=faulty_env.NAME, workers=2 * N, step_timeout=1.0, fault=fault, fault_seed=1,
        fault_turn=2, hang_seconds=30.0, once=faulty,
    )  # fmt: skip
    sessions = [(g, s) for g in range(2) for s in range(N)]
    with caplog.at_level(logging.WARNING, logger=agent_loop.__name__):
        outs, seconds = play(config, TinyServer(model, tokenizer), tokenizer, sessions)
    assert seconds < 20.0  # one step timeout plus process starts, not the 30 s hang
    (bad,) = errored_sessions(outs)
    assert bad[0] == 1
    outputs = outs[bad]
    assert [o.extra_fields["turn"] for o in outputs] == [0]  # its first turn is kept
    assert all(o.extra_fields["errored"] and o.extra_fields["success"] == 0.0 for o in outputs)
    assert outputs[-1].extra_fields[field] == 1
    assert totals(outs) == {**dict.fromkeys(agent_loop.FAILURE_FIELDS.values(), 0), field: 1}
    assert f"trajectory uid-1_{bad[1]} errored: {message}" in caplog.text
    for key, outputs in outs.items():  # the other sessions play to their end
        if key != bad:
            last = outputs[-1].extra_fields
            assert last["done"] or len(outputs) == MAX_TURNS
            assert [o.extra_fields["turn"] for o in outputs] == list(range(len(outputs)))
    # the failed environment was closed, the others serve the next batch: one more is built
    leases = agent_loop.env_leases(agent_loop.plugin_config(config).env)
    assert leases.built == len(sessions) and len(leases.free) == len(sessions) - 1
    again, _ = play(config, TinyServer(model, tokenizer), tokenizer, sessions)
    assert leases.built == len(sessions) + 1 and not errored_sessions(again)  # fault spent


def test_errored_rows_reach_the_trainer_left_out_and_counted(tiny_policy, faulty):
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    from mcgpo.integrations.verl.batch import batch_credit

    model, tokenizer = tiny_policy
    config = config_with(
        name=faulty_env.NAME, workers=N, step_timeout=1.0, fault="abort", fault_seed=0,
        fault_turn=2, once=faulty,
    )  # fmt: skip
    outs, _ = play(config, TinyServer(model, tokenizer), tokenizer, [(0, s) for s in range(N)])
    fields = []
    for (g, s), outputs in outs.items():  # as verl's _agent_loop_postprocess stores them
        for o in outputs[:-1]:  # verl copies the final output's score to the others
            o.reward_score = outputs[-1].reward_score
        for o in outputs:
            field = o.as_dict()
            field.update(uid=f"uid-{g}", session_id=s)
            fields.append(field)
    data = list_of_dict_to_tensordict(fields)
    extra = list(data["extra_fields"])
    assert sum(f["env_crashes"] for f in extra) == 1
    result = batch_credit(data, agent_loop.plugin_config(config).algo)
    errored = [bool(f["errored"]) for f in extra]
    assert sum(errored) == 1 and list(result.table.errored) == errored
    assert list(result.learn) == [not e for e in errored]  # learned from: all but that row


@pytest.mark.parametrize(("fault", "field"), [("hang", "env_timeouts"), ("abort", "env_crashes")])
def test_a_failed_reset_is_counted_on_a_later_output(tiny_policy, faulty, fault, field):
    model, tokenizer = tiny_policy
    config = config_with(
        name=faulty_env.NAME, workers=N, step_timeout=1.0, fault=fault, fault_seed=1,
        fault_turn=0, hang_seconds=30.0, once=faulty,
    )  # fmt: skip
    sessions = [(1, s) for s in range(N)]
    outs, seconds = play(config, TinyServer(model, tokenizer), tokenizer, sessions)
    assert seconds < 20.0
    empty = [key for key, outputs in outs.items() if not outputs]
    assert len(empty) == 1 and not errored_sessions(outs)  # no output: nothing to learn from
    # counted on the output of a session that ended after it, or held for the next one
    pending = agent_loop.unreported_failures()
    assert totals(outs)[field] + pending.get(field, 0) == 1
    later, _ = play(config, TinyServer(model, tokenizer), tokenizer, [(0, 0)])
    assert totals(outs)[field] + totals(later)[field] == 1
    assert later[(0, 0)][-1].extra_fields[field] == pending.get(field, 0)
    assert agent_loop.unreported_failures() == {}


@pytest.mark.parametrize("turn", [1, 2])
def test_an_environment_exception_in_process_is_counted_as_an_error(tiny_policy, faulty, turn):
    model, tokenizer = tiny_policy
    config = config_with(
        name=faulty_env.NAME, fault="raise", fault_seed=0, fault_turn=turn, once=faulty
    )
    sessions = [(0, s) for s in range(N)]
    outs, _ = play(config, TinyServer(model, tokenizer), tokenizer, sessions)
    pending = agent_loop.unreported_failures().get("env_errors", 0)
    assert totals(outs)["env_errors"] + pending == 1
    if turn == 1:  # a failed first step leaves no output: its error waits for a later one
        assert sum(not o for o in outs.values()) == 1 and not errored_sessions(outs)
    else:
        (bad,) = errored_sessions(outs)
        assert [o.extra_fields["turn"] for o in outs[bad]] == [0] and pending == 0
        assert outs[bad][-1].extra_fields["env_errors"] == 1
    leases = agent_loop.env_leases(agent_loop.plugin_config(config).env)
    assert leases.built == N and len(leases.free) == N - 1  # in process, the failed one closed


def test_a_cancelled_session_gives_its_environment_back(tiny_policy, faulty):
    model, tokenizer = tiny_policy
    config = config_with(
        name=faulty_env.NAME, workers=1, step_timeout=1.0, fault="hang", fault_seed=0,
        fault_turn=1, hang_seconds=30.0, once=faulty,
    )  # fmt: skip
    leases = agent_loop.env_leases(agent_loop.plugin_config(config).env)
    kwargs = {"uid": "uid-0", "session_id": 0, "index": 0, "extra_info": {}}

    async def cancel_midstep():
        task = asyncio.ensure_future(
            loop_of(config, TinyServer(model, tokenizer), tokenizer).run(
                dict(VERL_PARAMS), **kwargs
            )
        )
        while not faulty_claimed(faulty):
            await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(asyncio.wait_for(cancel_midstep(), 30))
    assert leases.leased == 0 and leases.free == []  # not reused: its step still ran
    again, _ = play(config, TinyServer(model, tokenizer), tokenizer, [(0, 0)])  # cap of 1 free
    assert not errored_sessions(again) and leases.built == 2


def faulty_claimed(once: str) -> bool:
    from pathlib import Path

    return any(Path(once).iterdir())


def test_the_cache_is_keyed_by_the_whole_env_config():
    from mcgpo.training.config import EnvConfig

    a = agent_loop.env_leases(EnvConfig(name="household", options={"n_receptacles": 4}))
    assert agent_loop.env_leases(EnvConfig(name="household", options={"n_receptacles": 4})) is a
    for other in (
        EnvConfig(name="household", options={"n_receptacles": 5}),
        EnvConfig(name="household", options={"n_receptacles": 4}, workers=2),
        dataclasses.replace(EnvConfig(name="household", options={"n_receptacles": 4}),
                            step_timeout=3.0),
    ):  # fmt: skip
        assert agent_loop.env_leases(other) is not a


# ---- a served environment (mcgpo env serve) ----------------------------------------------


def test_a_served_environment_plays_as_the_local_one_and_its_failures_are_counted(
    tiny_policy, monkeypatch
):
    pytest.importorskip("uvicorn")
    from pathlib import Path

    from mcgpo.envs.serving.launch import ServedEnv
    from mcgpo.envs.workers import EnvSpec

    envs_tests = Path(__file__).parents[1] / "envs"
    monkeypatch.syspath_prepend(str(envs_tests))  # pool_fakes, for the server's workers
    from pool_fakes import FaultSpec

    model, tokenizer = tiny_policy
    sessions = [(g, s) for g in range(2) for s in range(N)]
    # one after the other: TinyServer draws from one generator in request order
    local, _ = play(
        config_with(), TinyServer(model, tokenizer), tokenizer, sessions, concurrent=False
    )
    with ServedEnv(EnvSpec("household"), "household") as url:
        config = config_with(name="remote", url=url, remote_name="household", workers=4)
        remote, _ = play(
            config, TinyServer(model, tokenizer), tokenizer, sessions, concurrent=False
        )
        leases = agent_loop.env_leases(agent_loop.plugin_config(config).env)
        assert leases.workers == 0 and not any(p.processes() for p in leases.free)
    for key in sessions:
        assert [o.extra_fields for o in remote[key]] == [o.extra_fields for o in local[key]]
    # task 1 crashes its server-side worker at the first step, task 0 plays: one crash
    with ServedEnv(FaultSpec({(1, 1): "exit"}), "fault") as url:
        config = config_with(name="remote", url=url, remote_name="fault")
        # task 1 first: a session without output hands its count to the next output here
        sessions = [(1, 0), (0, 0)]
        outs, _ = play(config, TinyServer(model, tokenizer), tokenizer, sessions, concurrent=False)
    assert outs[(1, 0)] == [] and outs[(0, 0)]
    assert totals(outs) == {"env_timeouts": 0, "env_crashes": 1, "env_errors": 0}


# ---- robust by default: the shipped configs ----------------------------------------------

CONFIGS = __import__("pathlib").Path(__file__).parents[2] / "configs" / "verl"
SHIPPED = sorted(p.stem for p in CONFIGS.glob("*.yaml"))


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_config_steps_environments_in_workers_with_a_timeout(name):
    from mcgpo.integrations.verl.check import compose_config

    run = agent_loop.plugin_config(compose_config(str(CONFIGS), name, ()))
    assert run.env.workers == 16 and run.env.step_timeout == 60.0
    if run.env.name == "alfworld":  # the games are named, never left to `auto`
        assert run.env.options["source"] == "official"
    # top-level keys: overriding them needs no `+` (Hydra refuses a new key without one)
    over = compose_config(str(CONFIGS), name, ("mcgpo.env.workers=4", "mcgpo.env.step_timeout=5.5"))
    assert (over.mcgpo.env.workers, over.mcgpo.env.step_timeout) == (4, 5.5)
    with pytest.raises(Exception, match="workerz"):
        compose_config(str(CONFIGS), name, ("mcgpo.env.workerz=4",))
