"""The built wheel installs under one import name, beside a user's own ``domain`` package.

The wheel is built from a copy of the source tree (as a user's ``pip`` would
build it) and installed into a fresh virtual environment. So that the test
needs no network, that environment sees the development environment's
third-party packages through a ``.pth`` line naming their directory; the
``.pth`` files *in* that directory (among them the editable finder that
maps ``turnlog`` to this checkout) are not processed that way, and the test
checks that ``turnlog`` is imported from the fresh environment's copy.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ("domain", "application", "projections", "interface")

pytestmark = pytest.mark.timeout(300)


def _source_copy(target: Path) -> Path:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    target.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, target / name)
    for layer in LAYERS:
        shutil.copytree(ROOT / layer, target / layer, ignore=ignore)
    # turnlog/<layer> are links to ../<layer>; copy them as links, as a checkout has them.
    shutil.copytree(ROOT / "turnlog", target / "turnlog", symlinks=True, ignore=ignore)
    return target


def _build_wheel(tmp_path: Path) -> Path:
    source = _source_copy(tmp_path / "src")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "--wheel-dir", str(tmp_path / "wheels"), str(source)],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    [wheel] = (tmp_path / "wheels").glob("turnlog-*.whl")
    return wheel


def _fresh_venv(path: Path) -> tuple[Path, Path]:
    venv.EnvBuilder(with_pip=False).create(path)
    python = path / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    site_packages = Path(purelib)
    # Third-party dependencies come from the development environment (no network).
    dev_site = sysconfig.get_path("purelib")
    (site_packages / "zz_dev_dependencies.pth").write_text(dev_site + "\n")
    return python, site_packages


def _install(wheel: Path, python: Path) -> None:
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
         "--no-index", str(wheel)],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr


def test_the_wheel_installs_beside_a_users_own_domain_package(tmp_path: Path) -> None:
    wheel = _build_wheel(tmp_path)
    python, site_packages = _fresh_venv(tmp_path / "venv")
    _install(wheel, python)
    assert not [p for p in LAYERS if (site_packages / p).exists()], "a bare layer was installed"

    # The user's own package named like one of turnlog's layers.
    (site_packages / "domain").mkdir()
    (site_packages / "domain" / "__init__.py").write_text("OWNER = 'the user'\n")
    probe = (
        "import domain, turnlog, turnlog.domain.session, turnlog.interface.cli\n"
        "print(domain.OWNER)\n"
        "print(turnlog.__file__)\n"
        "print(turnlog.domain.session.__file__)\n"
        "print(turnlog.__version__)\n"
    )
    done = subprocess.run(
        [str(python), "-c", probe], capture_output=True, text=True, cwd=tmp_path, timeout=120
    )
    assert done.returncode == 0, done.stderr
    owner, package_file, layer_file, version = done.stdout.splitlines()
    assert owner == "the user"
    assert Path(package_file).is_relative_to(site_packages), package_file
    assert Path(layer_file).is_relative_to(site_packages / "turnlog"), layer_file
    assert version == "0.1.0"

    helped = subprocess.run(
        [str(python.parent / "turnlog"), "--help"],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert helped.returncode == 0, helped.stderr
    assert "serve" in helped.stdout


def test_importing_turnlog_is_cheap_and_its_public_names_resolve() -> None:
    probe = (
        "import sys, turnlog\n"
        "heavy = ('fastapi', 'psycopg', 'eventsourcing', 'httpx')\n"
        "heavy = [m for m in heavy if m in sys.modules]\n"
        "print(','.join(heavy) or '-')\n"
        "missing = [n for n in turnlog.__all__ if getattr(turnlog, n, None) is None]\n"
        "print(','.join(missing) or '-')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert done.returncode == 0, done.stderr
    heavy, missing = done.stdout.split()
    assert heavy == "-", f"import turnlog loads {heavy}"
    assert missing == "-", f"turnlog.__all__ names what it lacks: {missing}"


def test_the_readme_quickstart_script_runs_from_the_installed_wheel(
    tmp_path: Path, settings: Any
) -> None:
    """The wheel in a fresh environment: its ``turnlog serve``, killed and restarted, and the
    README's client script run with that environment's Python, not this checkout's."""
    from tests.conftest import turnlog_env
    from tests.deadlines import poll, scaled
    from tests.e2e.test_readme_quickstart import README_URL, Output, expected_prints, quickstart
    from tests.e2e.test_serve import wait_ready
    from tests.fault.cluster import free_port

    wheel = _build_wheel(tmp_path)
    python, _ = _fresh_venv(tmp_path / "venv")
    _install(wheel, python)
    _, script, _ = quickstart()
    port, log = free_port(), tmp_path / "serve.log"
    url = f"http://127.0.0.1:{port}"
    (tmp_path / "quickstart.py").write_text(script.replace(README_URL, url))
    env = turnlog_env(settings)
    env.pop("PYTHONPATH", None)  # nothing of this checkout: the installed wheel alone

    def serve() -> subprocess.Popen[bytes]:
        with log.open("ab") as out:
            proc = subprocess.Popen(
                [str(python.parent / "turnlog"), "serve", "--port", str(port)],
                stdout=out, stderr=subprocess.STDOUT, env=env, cwd=tmp_path,
            )  # fmt: skip
        wait_ready(proc, url, log)
        return proc

    server = serve()
    client = subprocess.Popen(
        [str(python), "-u", "quickstart.py"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, cwd=tmp_path, env=env,
    )  # fmt: skip
    assert client.stdout is not None and client.stdin is not None and client.stderr is not None
    out = Output(client.stdout)
    again = None
    try:
        poll(lambda: "press Enter" in out.text or client.poll() is not None, 60, "the prompt")
        assert client.poll() is None, client.stderr.read()
        server.kill()
        server.wait(timeout=scaled(30))
        again = serve()
        client.stdin.write("\n")
        client.stdin.flush()
        assert client.wait(timeout=scaled(60)) == 0, client.stderr.read()
    finally:
        for proc in (client, server, again):
            if proc is not None and proc.poll() is None:
                proc.kill()
    said = poll(lambda: "TurnCompleted" in out.text and out.text, 10)
    assert said.splitlines()[0] == expected_prints(script)[0], said
    assert "site-packages" in subprocess.run(
        [str(python), "-c", "import turnlog; print(turnlog.__file__)"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60,
    ).stdout  # fmt: skip
