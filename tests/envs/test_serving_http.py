"""`mcgpo env serve` over HTTP: bad requests get a 4xx naming what is wrong and the server
keeps serving; the token, the bind rule, the session bound, idle sessions; the JSON codec."""

from __future__ import annotations

import json
import time

import pytest

pytest.importorskip("uvicorn")
pytest.importorskip("starlette")
httpx = pytest.importorskip("httpx")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from mcgpo.envs import Context, Observation, StepResult, make_env  # noqa: E402
from mcgpo.envs.serving import wire  # noqa: E402
from mcgpo.envs.serving.client import RemoteEnv, RemoteEnvError  # noqa: E402
from mcgpo.envs.serving.command import main as serve_main  # noqa: E402
from mcgpo.envs.serving.launch import ServedEnv  # noqa: E402
from mcgpo.envs.serving.security import ServeError, check_bind, read_token  # noqa: E402
from mcgpo.envs.workers import EnvSpec  # noqa: E402

pytestmark = pytest.mark.serve
TOKEN = "s3cret-token-0123456789"


@pytest.fixture(scope="module")
def served():
    with ServedEnv(EnvSpec("household"), "household", max_sessions=8) as url:
        yield url


def opened(url: str, **headers: str) -> str:
    r = httpx.post(f"{url}/v1/sessions", json={}, headers=headers)
    assert r.status_code == 201, r.text
    return r.json()["session"]


def error(r: httpx.Response) -> tuple[int, str, str]:
    err = r.json()["error"]
    return r.status_code, err["code"], err["message"]


def test_bad_requests_get_a_4xx_naming_the_problem_and_the_server_keeps_serving(served):
    sid = opened(served)
    fresh = opened(served)  # never reset
    url = f"{served}/v1/sessions/{sid}"
    cases = [
        (("POST", f"{url}/reset"), {"content": b"{seed: 1"}, 400, "bad_json", "not valid JSON"),
        (("POST", f"{url}/reset"), {"content": b"[1, 2]"}, 400, "bad_request", "JSON object, got an array"),
        (("POST", f"{url}/reset"), {"json": {}}, 400, "bad_request", "missing field 'seed' (integer)"),
        (("POST", f"{url}/reset"), {"json": {"seed": "3"}}, 400, "bad_request", "field 'seed': expected an integer, got a string"),
        (("POST", f"{url}/reset"), {"json": {"seed": True}}, 400, "bad_request", "field 'seed': expected an integer, got a boolean"),
        (("POST", f"{url}/reset"), {"json": {"seed": 1, "sede": 2}}, 400, "bad_request", "unknown field 'sede'"),
        (("POST", f"{url}/reset"), {"json": {"seed": 2**70}}, 400, "bad_request", "out of the 64-bit"),
        (("POST", f"{url}/step"), {"json": {"action": ["go"]}}, 400, "bad_request", "field 'action': expected a string, got an array"),
        (("POST", f"{served}/v1/sessions/{fresh}/step"), {"json": {"action": "look"}}, 409, "session_new", "reset it first"),
        (("POST", f"{served}/v1/sessions/nope/step"), {"json": {"action": "look"}}, 404, "unknown_session", "no session 'nope'"),
        (("DELETE", f"{served}/v1/sessions/nope"), {}, 404, "unknown_session", "no session 'nope'"),
        (("POST", f"{url}/step"), {"content": b"x" * (2 << 20)}, 413, "body_too_large", "limit is 1048576"),
        (("POST", f"{url}/step"), {"content": iter([b"x" * (1 << 19)] * 3)}, 413, "body_too_large", "limit of 1048576"),
        (("GET", f"{served}/v2/things"), {}, 404, "not_found", "GET /v2/things"),
        (("GET", f"{url}/step"), {}, 405, "method_not_allowed", "GET"),
        (("POST", f"{served}/v1/sessions"), {"json": {"env": "webshop"}}, 404, "unknown_env", "serves 'household', not 'webshop'"),
        (("POST", f"{served}/v1/sessions"), {"json": {"options": {"n_receptacles": 9}}}, 409, "options_mismatch", "option 'n_receptacles': the request asks 9"),
        (("POST", f"{served}/v1/sessions"), {"json": {"session": "bad id!"}}, 400, "bad_request", "field 'session'"),
        (("POST", f"{served}/v1/sessions"), {"json": {"options": [1]}}, 400, "bad_request", "field 'options': expected an object"),
    ]  # fmt: skip
    for (method, where), kwargs, status, code, fragment in cases:
        if "content" in kwargs:  # bytes that say they are JSON
            kwargs["headers"] = {"content-type": "application/json"}
        r = httpx.request(method, where, **kwargs)
        got = error(r)
        assert got[:2] == (status, code), (where, kwargs.keys(), r.text)
        assert fragment in got[2], got
        assert "\n" not in got[2]
    # still serving: the session that took every bad request plays normally
    local = make_env("household")
    obs = httpx.post(f"{url}/reset", json={"seed": 4}).json()["observation"]
    assert wire.observation_from_json(obs) == local.reset(seed=4)
    action = local.expert_action()
    res = httpx.post(f"{url}/step", json={"action": action}).json()
    assert wire.step_result_from_json(res) == local.step(action)
    assert httpx.get(f"{served}/health").json()["status"] == "ok"
    for s in (sid, fresh):
        assert httpx.delete(f"{served}/v1/sessions/{s}").json() == {"closed": s}
    assert error(httpx.post(f"{url}/step", json={"action": "look"}))[:2] == (410, "session_ended")


def test_opening_a_session_is_idempotent_for_a_client_chosen_id(served):
    body = {"session": "client-chosen-1", "env": "household", "options": {}}
    first = httpx.post(f"{served}/v1/sessions", json=body)
    again = httpx.post(f"{served}/v1/sessions", json=body)
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json() == again.json() and first.json()["max_turns"] == 50
    assert httpx.get(f"{served}/health").json()["sessions"] == 1
    httpx.delete(f"{served}/v1/sessions/client-chosen-1")
    assert httpx.get(f"{served}/health").json()["sessions"] == 0


def test_the_token_guards_every_endpoint_but_health():
    with ServedEnv(EnvSpec("household"), "household", token=TOKEN, max_sessions=2) as url:
        assert httpx.get(f"{url}/health").status_code == 200  # open: for load balancers
        for headers in ({}, {wire.TOKEN_HEADER: "wrong"}, {wire.TOKEN_HEADER: TOKEN[:-1]}):
            for method, path in (("GET", "/v1/spec"), ("POST", "/v1/sessions")):
                r = httpx.request(method, url + path, json={}, headers=headers)
                assert error(r)[:2] == (401, "unauthorized"), r.text
        sid = opened(url, **{wire.TOKEN_HEADER: TOKEN})
        r = httpx.post(f"{url}/v1/sessions/{sid}/reset", json={"seed": 0})
        assert error(r)[:2] == (401, "unauthorized")  # a known session id is not enough


def test_the_remote_env_reads_its_token_from_a_file(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    with ServedEnv(EnvSpec("household"), "household", token=TOKEN, max_sessions=2) as url:
        env = RemoteEnv(url, "household", token_file=str(token_file))
        assert env.reset(seed=1) == make_env("household").reset(seed=1)
        env.close()
        with pytest.raises(ValueError, match="unauthorized"):
            RemoteEnv(url + "/", "household", retries=0)  # no token: refused at once


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.20", "example.org"])
def test_binding_beyond_loopback_needs_a_token(host):
    with pytest.raises(ServeError, match=f"binding {host} exposes .* --token-file"):
        check_bind(host, None)
    check_bind(host, TOKEN)  # allowed with one


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "localhost"])
def test_loopback_needs_no_token(host):
    check_bind(host, None)


def test_token_files_that_are_missing_or_short_are_refused(tmp_path):
    with pytest.raises(ServeError, match=r"token file .*/absent"):
        read_token(str(tmp_path / "absent"))
    short = tmp_path / "short"
    short.write_text("abc\n")
    with pytest.raises(ServeError, match="at least 16 characters"):
        read_token(str(short))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["serve", "--env", "household", "--host", "0.0.0.0"], "binding 0.0.0.0 exposes"),
        (["serve", "--env", "household", "--max-sessions", "0"], "--max-sessions must be >= 1"),
        (["serve", "--env", "household", "--step-timeout", "-1"], "--step-timeout must be"),
        (["serve", "--env", "household", "--port", "70000"], "--port must be in 0..65535"),
        (["serve", "--env", "household", "--env.n_receptacles"], "--env.n_receptacles needs a value"),
        (["serve", "--env", "household", "--bogus", "1"], "unknown option --bogus"),
        (["serve", "--env", "nope", "--port", "0"], "unknown environment 'nope'"),
        (["serve", "--env", "household", "--token-file", "/no/such/file"], "token file /no/such/file"),
        (["serve"], "the following arguments are required: --env"),
        (["stop"], "unknown env command 'stop'"),
    ],
)  # fmt: skip
def test_bad_serve_command_lines_exit_2_with_one_line(capsys, argv, message):
    try:
        code = serve_main(argv)
    except SystemExit as stop:  # argparse's own errors
        code = stop.code
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("mcgpo env serve: error: ") and message in err, err


def test_the_session_bound_and_closing_frees_a_place():
    with ServedEnv(EnvSpec("household"), "household", max_sessions=2) as url:
        a, _ = opened(url), opened(url)
        status, code, message = error(httpx.post(f"{url}/v1/sessions", json={}))
        assert (status, code) == (503, "server_full") and "2 of 2 sessions are open" in message
        httpx.delete(f"{url}/v1/sessions/{a}")
        opened(url)  # the closed session's place (and worker process) is reused
        assert httpx.get(f"{url}/health").json()["workers"] == 2


def test_idle_sessions_are_closed():
    with ServedEnv(
        EnvSpec("household"), "household", max_sessions=2, idle_timeout=0.5, reap_every=0.1
    ) as url:
        sid = opened(url)
        deadline = time.monotonic() + 60
        while httpx.get(f"{url}/health").json()["sessions"] and time.monotonic() < deadline:
            time.sleep(0.1)
        status, code, message = error(
            httpx.post(f"{url}/v1/sessions/{sid}/reset", json={"seed": 0})
        )
        assert (status, code) == (410, "session_ended") and "idle for more than 0.5 s" in message


def test_the_remote_env_refuses_a_server_that_does_not_match(served):
    with pytest.raises(ValueError, match="serves 'household', not 'webshop'"):
        RemoteEnv(served, "webshop")
    with pytest.raises(ValueError, match="option 'n_receptacles' is 9 here but left at its defa"):
        RemoteEnv(served, "household", n_receptacles=9)
    with pytest.raises(
        ValueError, match=r"the server was started with \(`mcgpo env serve` runs no"
    ):
        RemoteEnv(served, "household", n_receptacles=9)
    with pytest.raises(ValueError, match="remote_name must name the served environment"):
        RemoteEnv(served)  # the name forgotten: one line, not a TypeError
    with pytest.raises(ValueError, match="url must start with http"):
        RemoteEnv("ftp://x", "household")
    env = RemoteEnv(served, "household")
    with pytest.raises(RemoteEnvError, match="step before reset"):
        env.step("look")


def test_an_unreachable_server_is_one_line_at_construction():
    with pytest.raises(ValueError, match=r"remote env: http://127.0.0.1:9/v1/spec: ConnectError"):
        RemoteEnv("http://127.0.0.1:9", "household", retries=0, connect_timeout=2.0)
    with pytest.raises(ValueError, match=r"is `mcgpo env serve` running there\?\)$"):
        RemoteEnv("http://127.0.0.1:9", "household", retries=0, connect_timeout=2.0)


def test_a_reset_reopens_a_session_the_server_ended(served):
    env = RemoteEnv(served, "household")
    env.reset(seed=2)
    httpx.delete(f"{served}/v1/sessions/{env._session}")  # as an idle timeout would
    local = make_env("household")
    assert env.reset(seed=3) == local.reset(seed=3)  # a new session, the same task
    env.close()


texts = st.text(max_size=40)
observations = st.builds(
    Observation,
    text=texts,
    task=texts,
    admissible_actions=st.lists(texts, max_size=5).map(tuple),
    context=st.builds(
        Context,
        anchor=texts,
        state=texts,
        state_coarse=texts,
        progress=texts,
        enabled=texts,
        progress_value=st.floats(0, 1),
    ),
    task_type=texts,
)
infos = st.dictionaries(
    texts,
    st.one_of(st.booleans(), st.integers(-(2**53), 2**53), st.floats(allow_nan=False), texts),
    max_size=4,
)


@settings(max_examples=60, deadline=None)
@given(obs=observations, reward=st.floats(allow_nan=False), done=st.booleans(), info=infos)
def test_the_wire_format_round_trips_every_field(obs, reward, done, info):
    res = StepResult(observation=obs, reward=reward, done=done, info=info)
    sent = json.loads(wire.json_bytes(wire.step_result_json(res)))
    assert wire.step_result_from_json(sent) == res
    assert (
        wire.observation_from_json(json.loads(wire.json_bytes(wire.observation_json(obs)))) == obs
    )


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([], "step result: expected a JSON object, got an array"),
        ({"observation": {}, "reward": 1, "done": 1, "info": {}}, "step result.done: expected true or false"),
        ({"observation": {"text": "t", "task": "", "admissible_actions": ["a", 2]}, "reward": 0, "done": False, "info": {}}, "admissible_actions: expected a list of strings"),
        ({"observation": {"text": "t", "task": "", "admissible_actions": []}, "reward": "1", "done": False, "info": {}}, "step result.reward: expected a number, got a string"),
    ],
)  # fmt: skip
def test_a_malformed_answer_is_named(body, message):
    with pytest.raises(ValueError, match=message):
        wire.step_result_from_json(body)


def test_a_full_server_fails_a_reset_without_retries_and_serves_it_once_a_place_frees():
    from mcgpo.envs.serving.client import EnvServerError

    with ServedEnv(EnvSpec("household"), "household", max_sessions=1) as url:
        holder, waiting = RemoteEnv(url, "household"), RemoteEnv(url, "household", retries=0)
        holder.reset(seed=0)
        with pytest.raises(EnvServerError, match="server_full: 1 of 1 sessions are open"):
            waiting.reset(seed=1)
        holder.close()
        assert waiting.reset(seed=1) == make_env("household").reset(seed=1)
        r = httpx.delete(f"{url}/v1/sessions/{waiting._session}")
        assert r.json() == {"closed": waiting._session}


def test_a_taken_port_is_one_line_and_exit_2_before_any_worker_starts(capsys):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = serve_main(["serve", "--env", "household", "--port", str(port)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err == (
        f"mcgpo env serve: error: cannot bind 127.0.0.1:{port}: Address already in use"
    )
