"""Which of mcgpo's runtime dependencies the device image lacks, and carried wheels.

Standard library only (``packaging`` too where it is installed, for environment markers), so
that ``benchmarks/gpu/gpu_check.py`` can run it before anything heavy is imported.

    python benchmarks/gpu/gpu_check_deps.py missing [--image FILE]   # requirements to download
    python benchmarks/gpu/gpu_check_deps.py check-wheels DIR [--image FILE]

``missing`` prints, one per line, the requirements of ``[project] dependencies`` in
pyproject.toml (markers evaluated for the device's Python, 3.12) whose distribution is not in
the image's package list. That list is read from the device docs (KINDS.md, the paragraph
"Packages: a, b, c." under "Python packages already there") or from a plain file of one name
per line. ``check-wheels`` checks a folder of downloaded wheels: one version per
distribution, and every requirement of each wheel (its METADATA ``Requires-Dist`` lines,
extras skipped) either in the image or in the folder.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import subprocess
import sys
import zipfile
from collections.abc import Iterable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = ROOT / "pyproject.toml"
DEVICE_DOCS = Path("/work/.library/device/KINDS.md")  # this workplace's device docs
DEVICE_PYTHON = "3.12"  # the device image's Python (KINDS.md: 3.12.3)
# distributions whose import name is not the distribution name with "-" turned into "_"
IMPORT_NAMES = {"pyyaml": "yaml", "pillow": "PIL", "scikit-learn": "sklearn"}


class DepsError(ValueError):
    """A package list or requirement that cannot be read."""


def normalize(name: str) -> str:
    """PEP 503 name: lower case, runs of ``-``, ``_`` and ``.`` as one ``-``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    """The distribution name at the start of a PEP 508 requirement string."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    if not match:
        raise DepsError(f"cannot read a distribution name in requirement {requirement!r}")
    return normalize(match.group(1))


def import_name(distribution: str) -> str:
    """The top-level module of a distribution (``tomli-w`` -> ``tomli_w``)."""
    name = normalize(distribution)
    return IMPORT_NAMES.get(name, name.replace("-", "_"))


def marker_applies(requirement: str, python: str) -> bool:
    """False when the requirement's environment marker excludes Python ``python``."""
    if ";" not in requirement:
        return True
    marker = requirement.split(";", 1)[1].strip()
    try:
        from packaging.markers import Marker
    except ImportError:  # only python_version markers are read without packaging
        found = re.fullmatch(r"python_version\s*(<=|>=|<|>|==|!=)\s*['\"]([\d.]+)['\"]", marker)
        if not found:
            raise DepsError(f"cannot evaluate marker {marker!r} without packaging") from None
        have = tuple(int(x) for x in python.split("."))
        want = tuple(int(x) for x in found.group(2).split("."))
        return {
            "<": have < want, "<=": have <= want, ">": have > want, ">=": have >= want,
            "==": have == want, "!=": have != want,
        }[found.group(1)]  # fmt: skip
    full = python if python.count(".") >= 2 else f"{python}.0"
    return Marker(marker).evaluate({"python_version": python, "python_full_version": full})


def runtime_requirements(pyproject: Path = PYPROJECT, python: str | None = None) -> list[str]:
    """``[project] dependencies`` whose marker holds on Python ``python`` (default: this one)."""
    python = python or f"{sys.version_info.major}.{sys.version_info.minor}"
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    try:
        data = tomllib.loads(pyproject.read_text())
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise DepsError(f"cannot read {pyproject}: {err}") from None
    deps = data.get("project", {}).get("dependencies")
    if not isinstance(deps, list):
        raise DepsError(f"{pyproject} has no [project] dependencies list")
    return [d.split(";", 1)[0].strip() for d in deps if marker_applies(d, python)]


def image_packages(text: str) -> set[str]:
    """The normalized names in a device package list: KINDS.md's "Packages: a, b, c." line,
    else one name per line (blank lines and ``#`` comments skipped)."""
    found = re.search(r"Packages:\s*(.+?)\.[ \t]*(?:\n|$)", text, flags=re.DOTALL)
    if found:
        names = [n.strip() for n in found.group(1).split(",")]
    else:
        lines = (line.split("#", 1)[0].strip() for line in text.splitlines())
        names = [line for line in lines if line]
    bad = [n for n in names if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", n)]
    if not names or bad:
        raise DepsError(f"not a package list: {(bad or ['(empty)'])[0]!r}")
    return {normalize(n) for n in names}


def read_image_packages(path: Path = DEVICE_DOCS) -> set[str]:
    try:
        return image_packages(path.read_text())
    except OSError as err:
        raise DepsError(f"cannot read the device image's package list {path}: {err}") from None


def missing_requirements(requirements: Iterable[str], image: set[str]) -> list[str]:
    """The requirements whose distribution the image does not hold, in pyproject's order."""
    return [r for r in requirements if requirement_name(r) not in image]


def absent_here(requirements: Iterable[str]) -> list[str]:
    """The requirements whose top-level module cannot be found by this interpreter."""
    out = []
    for req in requirements:
        module = import_name(requirement_name(req))
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # a blocked or broken package counts as absent
            found = False
        if not found:
            out.append(req)
    return out


def wheel_distribution(path: Path) -> str:
    """The normalized distribution name of a wheel file (the name's first field)."""
    return normalize(path.name.split("-", 1)[0])


def wheels_for(folder: Path, requirements: Iterable[str]) -> dict[str, Path]:
    """The wheel in ``folder`` for each requirement that has one (name -> wheel)."""
    have = {wheel_distribution(w): w for w in sorted(folder.glob("*.whl"))} if folder else {}
    return {r: have[requirement_name(r)] for r in requirements if requirement_name(r) in have}


def install_wheels(wheels: Sequence[Path], target: Path) -> None:
    """``pip install --no-index --no-deps`` the wheels into ``target`` (no registry needed)."""
    cmd = [
        sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
        "--no-cache-dir", "--upgrade", "--disable-pip-version-check", "--target", str(target),
        *map(str, wheels),
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise DepsError(f"pip could not install {', '.join(w.name for w in wheels)}: {last}")


def wheel_requirements(path: Path, python: str = DEVICE_PYTHON) -> list[str]:
    """A wheel's ``Requires-Dist`` lines without extras, markers evaluated for ``python``."""
    with zipfile.ZipFile(path) as zf:
        meta = next((n for n in zf.namelist() if n.endswith(".dist-info/METADATA")), None)
        if meta is None:
            raise DepsError(f"{path.name} has no METADATA")
        text = zf.read(meta).decode("utf-8", "replace")
    reqs = []
    for line in text.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = line.split(":", 1)[1].strip()
        if "extra" in req.split(";", 1)[-1] and ";" in req:
            continue
        if marker_applies(req, python):
            reqs.append(req.split(";", 1)[0].strip())
    return reqs


def check_wheels(folder: Path, image: set[str]) -> list[str]:
    """Problems of a wheel folder: two versions of one distribution, or a requirement of a
    wheel that neither the image nor the folder holds. Empty when it is ready to carry."""
    wheels = sorted(folder.glob("*.whl"))
    names = [wheel_distribution(w) for w in wheels]
    problems = [f"two wheels of {n}" for n in sorted(set(names)) if names.count(n) > 1]
    for wheel in wheels:
        for req in wheel_requirements(wheel):
            name = requirement_name(req)
            if name not in image and name not in names:
                problems.append(f"{wheel.name} needs {req}: neither in the image nor in {folder}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("missing", "check-wheels"):
        cmd = sub.add_parser(name)
        cmd.add_argument("--image", type=Path, default=DEVICE_DOCS, help="device package list")
        cmd.add_argument("--pyproject", type=Path, default=PYPROJECT)
        if name == "check-wheels":
            cmd.add_argument("folder", type=Path)
    args = parser.parse_args(argv)
    try:
        image = read_image_packages(args.image)
        if args.command == "missing":
            for req in missing_requirements(
                runtime_requirements(args.pyproject, DEVICE_PYTHON), image
            ):
                print(req)
            return 0
        problems = check_wheels(args.folder, image)
    except DepsError as err:
        print(f"gpu_check_deps: {err}", file=sys.stderr)
        return 2
    for problem in problems:
        print(f"gpu_check_deps: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
