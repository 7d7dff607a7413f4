"""Parley installed as a package, not from the checkout: build the wheel from the sources alone, install it into a
fresh venv (no editable hook, not run from the repository) and run the commands a user would first type."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("cli", "parley", "voice", "llm_engine", "web", "desktop")

pytestmark = pytest.mark.slow


def _run(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{' '.join(argv)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """-> the bin/ of a fresh venv with the wheel installed. Its dependencies come from the test venv's
    site-packages, added as a plain path: that folder's .pth files (the checkout's editable hook) are not run."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"  # the sources only, so the build writes nothing into the checkout
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for pkg in (*PACKAGES, "configs"):
        shutil.copytree(ROOT / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    dist = tmp / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist), str(src)], tmp)
    (wheel,) = dist.glob("parley-*.whl")
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp)
    # pip itself installs it (console script included), from the file alone: no index, no dependencies
    _run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--no-deps", "--no-index", "-q",
          str(wheel)], tmp)  # fmt: skip
    purelib = Path(_run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], tmp).stdout.strip())
    (purelib / "deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return venv / "bin"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["HF_HUB_OFFLINE"] = "1"
    return env


def test_the_wheel_holds_every_package_and_the_shipped_files(installed: Path) -> None:
    out = _run([str(installed / "python"), "-c", "import cli.serve, parley, web, desktop.app, voice.remote.llm, web.realtime.endpoint, "
                "web.openai_api.app; print(parley.__file__)"], installed.parent, _env()).stdout  # fmt: skip
    assert str(ROOT) not in out, f"imported from the checkout, not the wheel: {out}"
    site = Path(out.strip()).parent.parent
    assert (site / "parley" / "configs" / "default.yaml").is_file()
    assert (site / "parley" / "configs" / "personas" / "assistant.yaml").is_file()
    assert (site / "web" / "static" / "index.html").is_file()
    assert list((site / "llm_engine" / "native").glob("*.cpp")), "the decode step's C++ source (compiled at first use)"


def test_the_installed_commands_run(installed: Path) -> None:
    cwd = installed.parent  # not the checkout
    assert "serve" in _run([str(installed / "parley"), "--help"], cwd, _env()).stdout
    assert "--server" in _run([str(installed / "parley"), "client", "--help"], cwd, _env()).stdout
    models = _run([str(installed / "parley"), "models"], cwd, _env()).stdout
    assert "llm" in models and "asr" in models and "tts" in models
    assert "--port" in _run([str(installed / "parley"), "serve", "--help"], cwd, _env()).stdout


def test_the_installed_parley_reads_the_configs_inside_the_wheel(installed: Path) -> None:
    """configs/ sits at the checkout's top level; installed, the default config is the copy the wheel carries."""
    out = _run([str(installed / "python"), "-c", "from parley.config import DEFAULT_CONFIG, load_config; "
                "print(DEFAULT_CONFIG); print(load_config().default_persona)"], installed.parent, _env()).stdout  # fmt: skip
    path, persona = out.split()
    assert Path(path).is_file() and str(ROOT) not in path and Path(path).parent.name == "configs"
    assert Path(path).parent.parent.name == "parley" and persona
    # the command itself: a bad override's error names the file it read
    bad = subprocess.run([str(installed / "parley"), "--set", "server.port=eighty", "models"], cwd=installed.parent,
                         env=_env(), capture_output=True, text=True, timeout=120)  # fmt: skip
    assert bad.returncode == 2 and bad.stderr.startswith(f"parley: config error: {path}: server.port:"), bad.stderr


def test_a_checkout_reads_the_top_level_configs(capsys: pytest.CaptureFixture[str]) -> None:
    """In the checkout (no wheel built), the `parley` command reads configs/ at the repository's top, and no copy
    inside the package shadows it."""
    from cli.main import main
    from parley.config import DEFAULT_CONFIG

    assert DEFAULT_CONFIG == ROOT / "configs" / "default.yaml" and not (ROOT / "parley" / "configs").exists()
    assert main(["--set", "server.port=eighty", "models"]) == 2
    assert capsys.readouterr().err.startswith(f"parley: config error: {ROOT / 'configs' / 'default.yaml'}: server.port:")
