"""benchmarks/gpu_check.py: the CPU dry run, its per-part processes, faults, budget, wheels."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
SCRIPT = BENCH / "gpu_check.py"


def load(name):
    if name in sys.modules:
        return sys.modules[name]
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def env_for(out=None, pythonpath=()):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([*map(str, pythonpath), str(ROOT / "src")]))
    env.pop("OUT", None)
    if out is not None:
        env["OUT"] = str(out)
    return env


def run_check(*args, out=None, pythonpath=(), timeout=300):
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--cpu-dry-run", *args], capture_output=True, text=True,
        env=env_for(out, pythonpath), timeout=timeout,
    )  # fmt: skip


def table_rows(text):
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0] in ("a", "b", "c", "d"):
            rows[(cells[0], cells[1])] = (cells[2], cells[3])
    return rows


def gone(pid):
    """The process no longer runs (absent, or a zombie waiting for init)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")


@pytest.mark.slow
def test_the_dry_run_writes_every_row_with_a_number(tmp_path):
    out = tmp_path / "out"  # not there yet: the check makes it
    done = run_check(out=out)
    assert done.returncode == 0, done.stderr[-3000:]
    written = (out / "gpu_check.md").read_text()
    assert written in done.stdout  # the same table, printed and written
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["finished"] and report["dry_run"]
    rows = table_rows(written)
    gpu_check = load("gpu_check")
    for key, measures in gpu_check.MEASURES.items():
        assert report["parts"][key]["status"] == "ok", report["parts"][key]
        assert [r[0] for r in report["parts"][key]["rows"]] == measures
        for measure in measures:
            value = rows[(key, measure)][0]
            if measure == "mcgpo train model":
                assert value == "2 of 2 layers"
                continue
            assert float(value) == float(value), (key, measure, value)  # a number, not nan
    assert rows[("d", "mcgpo train exit code")][0] == "0"
    assert float(rows[("b", "padding share")][0]) < 0.5
    # decode is timed apart from prefill: faster than the whole call's rate
    whole = float(rows[("a", "static prefill s")][1].split()[2])
    assert float(rows[("a", "static decode tok/s")][0]) > 4 * 4 / whole  # DRY: 4 rows x 4 new
    # the ratio row is the two memory rows divided
    peak, planned = (float(rows[("b", m)][0]) for m in ("update peak memory GB", "memory plan GB"))
    ratio = float(rows[("b", "measured / plan")][0])
    assert ratio == pytest.approx(peak / planned, rel=0.02)
    assert float(rows[("d", "mcgpo train disk GB")][0]) < 2.0


@pytest.mark.slow
def test_a_hung_a_raising_and_an_aborting_part_cost_only_themselves(tmp_path):
    out = tmp_path / "out"
    start = time.monotonic()
    done = run_check(
        "--inject-fault", "a:hang@1", "--inject-fault", "b:raise", "--inject-fault", "d:abort",
        "--limits", "a=30", out=out,
    )  # fmt: skip
    seconds = time.monotonic() - start
    assert done.returncode == 0, done.stderr[-3000:]
    parts = json.loads((out / "gpu_check.json").read_text())["parts"]
    a, b, c, d = (parts[k] for k in "abcd")
    # a hung after its first rows: killed at 30 s, the rows it wrote kept (30 s, not less:
    # on a loaded 2-core machine part a took over 15 s to write its first row)
    assert a["status"] == "timeout" and 30 <= a["seconds"] < 40
    assert "SIGKILL" in a["why"] and "30 s limit" in a["why"]
    assert a["rows"][0][0] == "generate tok/s" and float(a["rows"][0][1]) > 0
    assert gone(a["pid"])
    assert b["status"] == "error" and b["rows"] == []
    assert b["why"].startswith("RuntimeError: injected fault in part b (gpu_check_parts.py:")
    assert d["status"] == "died" and "SIGABRT" in d["why"]
    assert c["status"] == "ok" and len(c["rows"]) == 4
    rows = table_rows((out / "gpu_check.md").read_text())
    assert rows[("a", "generate tok/s")][0] == a["rows"][0][1]
    assert rows[("a", "static decode tok/s")][0] == "TIMEOUT"  # not measured, said so
    assert rows[("b", "update MFU %")][0] == "ERROR"
    assert rows[("d", "part d: mcgpo train")][0] == "died"
    assert float(rows[("c", "max abs dlogp, sampler vs bf16 fwd")][0]) >= 0
    log = (out / "gpu_check.log").read_text()  # each part's output, the traceback too
    assert "===== part b: update" in log and "RuntimeError: injected fault in part b" in log
    assert seconds < 150


def test_a_spent_budget_skips_the_rest_and_says_so(tmp_path):
    out = tmp_path / "out"
    start = time.monotonic()
    # a starts a child and hangs: the kill of a's process group ends the child too
    done = run_check("--parts", "ab", "--inject-fault", "a:orphan", "--budget-s", "12", out=out)
    assert done.returncode == 0, done.stderr[-3000:]
    assert time.monotonic() - start < 25
    parts = json.loads((out / "gpu_check.json").read_text())["parts"]
    assert set(parts) == {"a", "b"}
    assert parts["a"]["status"] == "timeout" and parts["a"]["limit_s"] <= 12
    assert parts["a"]["rows"][0][0] == "child pid"
    assert gone(int(parts["a"]["rows"][0][1]))
    assert parts["b"]["status"] == "skipped" and "of the 12 s budget" in parts["b"]["why"]
    rows = table_rows((out / "gpu_check.md").read_text())
    assert rows[("b", "update tok/s")][0] == "SKIPPED"


def test_sigterm_keeps_the_finished_parts_and_kills_the_running_one(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--cpu-dry-run", "--parts", "cd",
         "--inject-fault", "d:hang", "--limits", "d=300"],
        env=env_for(out), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    report, deadline = {}, time.monotonic() + 120
    while time.monotonic() < deadline:  # the JSON shows c done while d still runs
        try:
            report = json.loads((out / "gpu_check.json").read_text())
        except (OSError, ValueError):
            report = {}
        if report.get("parts", {}).get("d", {}).get("status") == "running":
            break
        time.sleep(0.2)
    try:
        assert report["parts"]["c"]["status"] == "ok" and len(report["parts"]["c"]["rows"]) == 4
        assert not report["finished"]
        assert "RUNNING: partial table" in (out / "gpu_check.md").read_text()
        pid = report["parts"]["d"]["pid"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    finally:
        proc.kill()
        proc.wait()
    after = json.loads((out / "gpu_check.json").read_text())
    assert after["parts"]["c"] == report["parts"]["c"]
    assert after["parts"]["d"]["status"] == "interrupted"
    time.sleep(0.5)
    assert gone(pid)


BLOCKER = """
import importlib.machinery, sys
BLOCKED = {blocked!r}
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] not in BLOCKED:
            return None
        for entry in sys.path:  # what gpu_check installed from carried wheels stays visible
            if "gpu_check_" in entry:
                spec = importlib.machinery.PathFinder.find_spec(name, [entry] if path is None else path)
                if spec is not None:
                    return spec
        raise ModuleNotFoundError(f"No module named {{name!r}} (blocked by the test)", name=name)
sys.meta_path.insert(0, _Block())
"""


def blocker(folder, *modules):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(BLOCKER.format(blocked=set(modules)))
    return folder


def runtime_requirements():
    return load("gpu_check_deps").runtime_requirements()


@pytest.mark.parametrize("requirement", runtime_requirements())
def test_each_missing_dependency_is_one_line_naming_the_wheel(tmp_path, requirement):
    deps = load("gpu_check_deps")
    name = deps.requirement_name(requirement)
    block = blocker(tmp_path / "block", deps.import_name(name))
    empty = tmp_path / "wheels"
    empty.mkdir()
    done = run_check("--wheels", str(empty), out=tmp_path / "out", pythonpath=[block], timeout=60)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith(f"gpu_check: missing Python package(s) {name} ({requirement})")
    assert "benchmarks/gpu_wheels.sh" in lines[0] and ".whl" in lines[0]


def make_wheel(folder, name, version, modules=None, requires=()):
    """A wheel file: ``modules`` {path in the wheel: text} and a METADATA with ``requires``."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    meta += "".join(f"Requires-Dist: {r}\n" for r in requires)
    files = dict(modules or {})
    files[f"{info}/METADATA"] = meta
    files[f"{info}/WHEEL"] = (
        "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    files[f"{info}/RECORD"] = "".join(f"{p},,\n" for p in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(path, "w") as zf:
        for p, text in files.items():
            zf.writestr(p, text)
    return path


def test_a_carried_wheel_is_installed_and_used(tmp_path):
    """tomli-w blocked in the environment, carried as a wheel of the same code: part d (which
    writes the run's config with tomli_w) runs from the wheel gpu_check installed."""
    import tomli_w

    source = Path(tomli_w.__file__).parent
    modules = {f"tomli_w/{f.name}": f.read_text() for f in source.glob("*.py")}
    wheel = make_wheel(tmp_path / "wheels", "tomli_w", "1.0.0", modules)
    block = blocker(tmp_path / "block", "tomli_w")
    done = run_check(
        "--wheels", str(wheel.parent), "--parts", "d", out=tmp_path / "out", pythonpath=[block]
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert report["wheels"] == [wheel.name]
    assert report["parts"]["d"]["status"] == "ok", report["parts"]["d"]
    assert f"carried wheels: {wheel.name}" in done.stdout


def test_bad_arguments_are_one_line_and_exit_2(tmp_path):
    for args, says in (
        (["--inject-fault", "a:explode"], "kind must be one of raise, hang, abort, orphan"),
        (["--inject-fault", "e:hang"], "PART in a, b, c, d"),
        (["--limits", "a=soon"], "seconds must be numbers"),
        (["--limits", "b=-1"], "positive seconds"),
        (["--parts", "xyz"], "letters from abcd"),
    ):
        done = run_check(*args, out=tmp_path / "out", timeout=60)
        assert done.returncode == 2, (args, done.stderr)
        assert done.stderr.count("\n") == 1 and says in done.stderr, (args, done.stderr)


@pytest.mark.skipif(
    shutil.which("nvidia-smi") is not None, reason="checks the answer without a GPU"
)
def test_without_cuda_it_says_so_in_one_line_and_exits_2():
    done = subprocess.run(
        [sys.executable, str(SCRIPT)], capture_output=True, text=True, env=env_for(), timeout=120
    )
    assert done.returncode == 2
    assert done.stderr.strip() == "gpu_check: no CUDA device here (use --cpu-dry-run on a CPU)"


# ---- the pieces, without processes ----


def test_train_flops_golden():
    from transformers import Qwen2Config

    parts = load("gpu_check_parts")
    config = Qwen2Config(
        hidden_size=8, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
        intermediate_size=16, vocab_size=10, tie_word_embeddings=True,
    )  # fmt: skip
    # parameters: attention 8x8 (q) + 2 x 8x4 (k, v: 1 KV head of 4) + 8x8 (o) + bias 8+4+4
    # = 208; MLP 3 x 8 x 16 = 384; 2 norms 16 -> layer 608; embedding 80; final norm 8: 696.
    # body = 696 - 80 (tied embedding: no FLOPs for the lookup; the head is counted apart)
    # rows of 3 and 5 tokens, 1 and 2 of them response:
    # 6 x 616 x 8 = 29,568; head 6 x 80 x 3 = 1,440; attention 12 x 1 layer x q 8 x
    # (3*4/2 + 5*6/2 = 21 pairs) = 2,016; total 33,024
    assert parts.train_flops(config, [3, 5], [1, 2]) == 33024
    untied = Qwen2Config(**{**config.to_dict(), "tie_word_embeddings": False})
    # untied: 80 more parameters (the head), still counted once, on response tokens only
    assert parts.train_flops(untied, [3, 5], [1, 2]) == 33024


def test_the_prefill_clock_sums_only_the_wrapped_calls():
    parts = load("gpu_check_parts")
    syncs = []
    clock = parts.PrefillClock(lambda: syncs.append(1))
    slow = clock.wrap(lambda t: time.sleep(t) or t)
    assert slow(0.05) == 0.05
    time.sleep(0.05)  # outside the wrapped call: not counted
    with pytest.raises(ZeroDivisionError):
        clock.wrap(lambda: 1 / 0)()  # a failing call still counts its time and syncs
    assert 0.05 <= clock.seconds < 0.09
    assert len(syncs) == 4  # before and after each call


def test_part_d_model_fits_its_disk_cap():
    parts = load("gpu_check_parts")
    from mcgpo.policy.memory import parameter_count

    class Fake(parts.Part):
        def __init__(self):  # the GPU shape without a device: only config() is used
            self.dry, self._tokenizer = False, type("T", (), {"__len__": lambda s: 807,
                "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0})()  # fmt: skip

    part = Fake()
    layers = parts.train_layers(part)

    def size(n):
        config = part.config(vocab_size=807, num_hidden_layers=n)
        return parts.DISK_BYTES_PER_PARAM * parameter_count(config)

    # the most layers whose 18 bytes per parameter stay within 90 % of 2 GB
    assert size(layers) <= 0.9 * parts.DISK_CAP < size(layers + 1)
    assert layers == 2  # 1.5B layers are 46.8 M parameters each: 2 fit, 3 do not
    with pytest.raises(ValueError, match="not even one layer"):
        parts.train_layers(part, cap=1e6)


KINDS_TEXT = """## Python packages already there

nvidia-h200: their image holds these. Packages: absl-py, numpy, torch, Transformers, tokenizers,
safetensors, tqdm, pyarrow, tensorboard, matplotlib, pyyaml.
"""


def test_missing_requirements_against_an_image_list():
    deps = load("gpu_check_deps")
    image = deps.image_packages(KINDS_TEXT)
    assert "transformers" in image and "absl-py" in image
    reqs = deps.runtime_requirements(python="3.12")
    assert not any(deps.requirement_name(r) == "tomli" for r in reqs)  # python < 3.11 only
    assert any(
        deps.requirement_name(r) == "tomli" for r in deps.runtime_requirements(python="3.10")
    )
    missing = deps.missing_requirements(reqs, image)
    assert [deps.requirement_name(r) for r in missing] == ["rapidfuzz", "tomli-w"]
    assert deps.import_name("tomli-w") == "tomli_w" and deps.import_name("PyYAML") == "yaml"
    plain = deps.image_packages("# a list\nnumpy\n\nTomli_W  # carried\n")
    assert plain == {"numpy", "tomli-w"}
    with pytest.raises(deps.DepsError, match="not a package list"):
        deps.image_packages("Packages: numpy, torch>=2, scipy.\n")
    with pytest.raises(deps.DepsError, match="cannot read the device image"):
        deps.read_image_packages(Path("/nonexistent/KINDS.md"))


@pytest.mark.skipif(not load("gpu_check_deps").DEVICE_DOCS.exists(), reason="no device docs")
def test_the_device_docs_image_lacks_rapidfuzz_and_tomli_w():
    deps = load("gpu_check_deps")
    reqs = deps.runtime_requirements(python=deps.DEVICE_PYTHON)
    missing = deps.missing_requirements(reqs, deps.read_image_packages())
    assert [deps.requirement_name(r) for r in missing] == ["rapidfuzz", "tomli-w"]


def test_check_wheels_finds_two_versions_and_unmet_requirements(tmp_path):
    deps = load("gpu_check_deps")
    folder = tmp_path / "w"
    make_wheel(folder, "alpha", "1.0", requires=["numpy>=1", "beta", "gamma; extra == 'x'",
                                                  "delta; python_version < '3.8'"])  # fmt: skip
    assert deps.check_wheels(folder, {"numpy"}) == [
        f"alpha-1.0-py3-none-any.whl needs beta: neither in the image nor in {folder}"
    ]
    make_wheel(folder, "beta", "2.0")
    assert deps.check_wheels(folder, {"numpy"}) == []
    make_wheel(folder, "beta", "2.1")
    assert deps.check_wheels(folder, {"numpy"}) == ["two wheels of beta"]
    assert deps.wheels_for(folder, ["alpha>=1", "zeta"]) == {
        "alpha>=1": folder / "alpha-1.0-py3-none-any.whl"
    }
