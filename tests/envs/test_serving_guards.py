"""What a web page, a careless client or an unlucky start-up cannot do to `mcgpo env serve`:
a foreign Origin or Host is refused without a token (403), bodies are JSON only (415), deep
JSON is a 400, an unknown split is a 4xx that leaves the session usable, session ids match in
full, echoed text is cut, an oversized header gets a JSON error, a token must be printable
ASCII, a token file others can read is warned about, and draining shows on /health."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import pytest

pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from mcgpo.envs import make_env  # noqa: E402
from mcgpo.envs.serving import wire  # noqa: E402
from mcgpo.envs.serving.client import RemoteEnv, RemoteEnvError  # noqa: E402
from mcgpo.envs.serving.command import main as serve_main  # noqa: E402
from mcgpo.envs.serving.launch import ServedEnv  # noqa: E402
from mcgpo.envs.serving.security import ServeError, read_token  # noqa: E402
from mcgpo.envs.workers import EnvSpec  # noqa: E402

pytestmark = pytest.mark.serve
WAIT = 120.0  # seconds: wide margins for a busy 2-core machine (never a speed assertion)
TOKEN = "s3cret-token-0123456789"


@pytest.fixture(scope="module")
def served():
    with ServedEnv(EnvSpec("household"), "household", max_sessions=4) as url:
        yield url


def error(r: httpx.Response) -> tuple[int, str, str]:
    err = r.json()["error"]
    return r.status_code, err["code"], err["message"]


def sessions(url: str) -> int:
    return httpx.get(f"{url}/health").json()["sessions"]


@pytest.mark.parametrize(
    ("headers", "code"),
    [
        ({"origin": "https://evil.example"}, "forbidden_origin"),
        ({"origin": "null"}, "forbidden_origin"),  # a sandboxed page
        ({"origin": "http://127.0.0.1.evil.example"}, "forbidden_origin"),
        ({"host": "evil.example:8765"}, "forbidden_host"),  # DNS rebinding
        ({"host": "localhost.evil.example"}, "forbidden_host"),
    ],
)
def test_a_web_page_cannot_open_a_session_on_the_tokenless_server(served, headers, code):
    r = httpx.post(f"{served}/v1/sessions", json={}, headers=headers)
    assert error(r)[:2] == (403, code)
    r = httpx.get(f"{served}/health", headers=headers)
    assert error(r)[:2] == (403, code)  # nor read what the server says
    assert sessions(served) == 0


@pytest.mark.parametrize(
    "headers",
    [{"origin": "http://localhost:3000"}, {"origin": "http://[::1]:1"}, {"host": "localhost"}],
)
def test_this_machines_own_origins_and_names_pass(served, headers):
    r = httpx.post(f"{served}/v1/sessions", json={}, headers=headers)
    assert r.status_code == 201, r.text
    assert httpx.delete(f"{served}/v1/sessions/{r.json()['session']}").status_code == 200


@pytest.mark.parametrize("kind", ["text/plain", "application/x-www-form-urlencoded", None])
def test_bodies_that_are_not_declared_json_are_refused(served, kind):
    headers = {} if kind is None else {"content-type": kind}
    r = httpx.post(f"{served}/v1/sessions", content=b'{"session": "s1"}', headers=headers)
    status, code, message = error(r)
    assert (status, code) == (415, "unsupported_media_type") and "application/json" in message
    assert sessions(served) == 0


def test_deep_json_is_a_400_and_the_server_keeps_serving(served):
    for depth in (40, 1000, 100_000):
        body = b'{"options": ' + b"[" * depth + b"]" * depth + b"}"
        r = httpx.post(
            f"{served}/v1/sessions", content=body, headers={"content-type": "application/json"}
        )
        status, code, message = error(r)
        assert (status, code) == (400, "bad_json") and "deeper than 32 levels" in message
    assert httpx.get(f"{served}/health").json()["status"] == "ok"


@pytest.mark.parametrize("sid", ["abc\n", "abc\r\n", "a" * 65, ""])
def test_a_session_id_must_match_in_full(served, sid):
    r = httpx.post(f"{served}/v1/sessions", json={"session": sid})
    assert error(r)[:2] == (400, "bad_request")
    assert sessions(served) == 0


def test_an_unknown_split_is_a_4xx_and_the_session_plays_on(served):
    env, local = RemoteEnv(served, "household"), make_env("household")
    with pytest.raises(RemoteEnvError, match="bad_reset: reset: HouseholdError: unknown split"):
        env.reset(seed=0, split="valid_nowhere")
    sid = env._session
    assert sid is not None  # the session was kept
    assert env.reset(seed=5) == local.reset(seed=5)
    assert env._session == sid
    action = local.expert_action()
    assert env.step(action) == local.step(action)
    env.close()


def test_echoed_text_is_cut(served):
    r = httpx.post(f"{served}/v1/sessions", json={"env": "x" * 500_000})
    status, code, message = error(r)
    assert (status, code) == (404, "unknown_env") and len(message) < wire.MAX_MESSAGE + 40
    r = httpx.post(f"{served}/v1/sessions/{'y' * 5000}/step", json={"action": "look"})
    assert r.status_code == 404 and len(error(r)[2]) < wire.MAX_MESSAGE + 40


def test_an_oversized_header_gets_a_json_error(served):
    host, port = served.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=WAIT) as sock:
        # headers still incomplete past uvicorn's 16 KiB limit (the rest never comes)
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 40_000)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431 ") and b"application/json" in head
    assert httpx.Response(431, content=body).json()["error"]["code"] == "headers_too_large"
    assert httpx.get(f"{served}/health").json()["status"] == "ok"


@pytest.mark.parametrize("token", ["s3cret-tökén-0123456789", "s3cret\ttoken-0123456789"])
def test_a_token_that_is_not_printable_ascii_is_refused_at_start_up(tmp_path, capsys, token):
    path = tmp_path / "token"
    path.write_text(token, encoding="utf-8")
    path.chmod(0o600)
    with pytest.raises(ServeError, match="printable ASCII"):
        read_token(str(path))
    assert serve_main(["serve", "--env", "household", "--token-file", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "printable ASCII" in err, err


def test_a_token_file_others_can_read_is_warned_about(tmp_path, capsys):
    path = tmp_path / "token"
    path.write_text(TOKEN)
    path.chmod(0o644)
    with socket.socket() as taken:  # the command then stops at the bind, before any worker
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        argv = ["serve", "--env", "household", "--token-file", str(path), "--port", port]
        assert serve_main(argv) == 2
        warned = capsys.readouterr().err
        path.chmod(0o600)
        assert serve_main(argv) == 2
        quiet = capsys.readouterr().err
    assert f"warning: token file {path} can be read by other users" in warned
    assert "chmod 600" in warned and "warning" not in quiet


def test_draining_shows_on_health_before_the_server_stops():
    proc = subprocess.Popen(
        [sys.executable, "-m", "mcgpo", "env", "serve", "--env", "household", "--port", "0",
         "--drain-seconds", "600"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        line = proc.stdout.readline()
        assert line.startswith("serving household on http://127.0.0.1:"), proc.stderr.read()
        url = line.split()[-1]
        env, local = RemoteEnv(url, "household"), make_env("household")
        assert env.reset(seed=2) == local.reset(seed=2)
        proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + WAIT
        while (r := httpx.get(f"{url}/health")).status_code == 200:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert r.status_code == 503 and r.json()["status"] == "draining"
        action = local.expert_action()
        assert env.step(action) == local.step(action)  # an open session goes on
        r = httpx.post(f"{url}/v1/sessions", json={})
        assert error(r)[:2] == (503, "draining")
        proc.send_signal(signal.SIGTERM)  # a second signal stops it now
        assert proc.wait(WAIT) in (0, -signal.SIGTERM)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(WAIT)
        proc.stdout.close()
        proc.stderr.close()
