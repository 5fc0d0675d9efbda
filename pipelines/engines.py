"""The local engines behind ``--runner PrismRunner``, ``FlinkRunner`` and ``SparkRunner``.

Beam's Python runners for these engines fetch what they run at an unannounced moment: the
Prism binary from a GitHub release, the Flink and Spark job-server jars from Maven Central,
and fail with a bare ``urlopen`` error where those are out of reach. Here each engine is
fetched or built once, by :func:`fetch`, into the cache (``$LMSHARDS_CACHE/engines``, else
``~/.cache/lmshards/engines``), announced in one line on stderr; what cannot be fetched is a
:class:`~schemas.errors.ConfigError` naming what is missing and the command that gets it.

- **Prism**: ``go install github.com/apache/beam/sdks/v2/go/cmd/prism@v<Beam's version>``.
- **Flink** (1.19) and **Spark** (3, Spark 3.5): Beam's runner library
  (``org.apache.beam:beam-runners-flink-1.19``, ``beam-runners-spark-3``) at
  :data:`JOB_SERVER_BEAM_VERSION` with the engine's own jars, resolved by Maven
  (``mvn dependency:copy-dependencies`` over a small pom written here) into the cache, and
  run as ``java -cp 'lib/*' <the runner's JobServerDriver>``. Beam publishes that job server
  as one shaded jar too; the library and its dependencies are the same classes.

A run on one of these engines is :class:`pipelines.engine_run.LocalEngine`
(:func:`pipelines.engine_run.local_engine` makes it for Beam's flags).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

from schemas.errors import ConfigError

__all__ = ["ENGINES", "JOB_SERVER_BEAM_VERSION", "Engine", "cache_root", "fetch", "main"]

#: Beam's Java runner libraries the Flink and Spark job servers are made of. The Python SDK
#: speaks to them through Beam's portable job API; the newest version whose dependencies every
#: registry serves (2.70.0's ``beam-runners-java-job-service`` is not on every mirror).
JOB_SERVER_BEAM_VERSION = "2.62.0"
_FLINK_VERSION = "1.19.0"
_SPARK_VERSION = "3.5.1"
#: Spark on Java 17 needs these, as Beam's own Spark job server launcher passes them.
_SPARK_JVM_ARGS = ("--add-opens=java.base/sun.nio.ch=ALL-UNNAMED", "--add-opens=java.base/java.nio=ALL-UNNAMED",
                   "--add-opens=java.base/java.util=ALL-UNNAMED",
                   "--add-opens=java.base/java.lang.invoke=ALL-UNNAMED")
_PRISM_PACKAGE = "github.com/apache/beam/sdks/v2/go/cmd/prism"
#: The Go that builds Prism where none new enough is installed (Beam 2.77's go.mod: toolchain go1.26.2).
_GO_TOOLCHAIN = "1.26.2"


@dataclass(frozen=True)
class Engine:
    """One engine: how it is fetched and how its job server starts."""

    name: str  #: ``prism``, ``flink``, ``spark``
    runner: str  #: Beam's runner class name
    title: str  #: for messages
    dependencies: tuple[tuple[str, str, str], ...] = ()  #: Maven ``(group, artifact, version)``
    driver: str = ""  #: the job server's main class (Java engines)
    jvm_args: tuple[str, ...] = field(default=())

    @property
    def cache_name(self) -> str:
        if self.name == "prism":
            return f"prism-{_beam_version()}"
        return f"{self.name}-beam-{JOB_SERVER_BEAM_VERSION}"


ENGINES = {
    engine.runner: engine for engine in (
        Engine("prism", "PrismRunner", "Beam's Prism runner"),
        Engine("flink", "FlinkRunner", f"Beam's Flink {_FLINK_VERSION.rsplit('.', 1)[0]} job server",
               (("org.apache.beam", "beam-runners-flink-1.19", JOB_SERVER_BEAM_VERSION),
                ("org.slf4j", "slf4j-jdk14", "1.7.30")),
               "org.apache.beam.runners.flink.FlinkJobServerDriver"),
        Engine("spark", "SparkRunner", f"Beam's Spark {_SPARK_VERSION} job server",
               (("org.apache.beam", "beam-runners-spark-3", JOB_SERVER_BEAM_VERSION),
                ("org.apache.spark", "spark-core_2.12", _SPARK_VERSION),
                ("org.apache.spark", "spark-streaming_2.12", _SPARK_VERSION)),
               "org.apache.beam.runners.spark.SparkJobServerDriver", _SPARK_JVM_ARGS),
    )
}
_BY_NAME = {engine.name: engine for engine in ENGINES.values()}


def _beam_version() -> str:
    from apache_beam.version import __version__

    return __version__


def cache_root() -> str:
    """Where engines are cached: ``$LMSHARDS_CACHE/engines``, else ``~/.cache/lmshards/engines``."""
    base = os.environ.get("LMSHARDS_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "lmshards")
    return os.path.join(base, "engines")


def _announce(line: str) -> None:
    print(f"lmshards: {line}", file=sys.stderr, flush=True)


def last_error_line(output: str) -> str:
    """The most telling line of a failed tool's output, without terminal colours."""
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line).strip() for line in output.splitlines()]
    lines = [line for line in lines if line and not line.startswith("[ERROR] -> [Help")]
    errors = [line for line in lines if line.startswith("[ERROR]") and len(line) > len("[ERROR] ")]
    return (errors[0] if errors else lines[-1] if lines else "no output")[:400]


def _install(engine: Engine, build) -> str:
    """Build ``engine`` with ``build(directory)`` into a fresh folder of the cache and move it into
    place (a concurrent build of the same engine leaves one of the two); its final folder."""
    final = os.path.join(cache_root(), engine.cache_name)
    if os.path.isfile(os.path.join(final, "ready")):
        return final
    os.makedirs(cache_root(), exist_ok=True)
    work = tempfile.mkdtemp(prefix=f".{engine.cache_name}-", dir=cache_root())
    try:
        build(work)
        open(os.path.join(work, "ready"), "w").close()
        try:
            os.rename(work, final)
        except OSError:  # another process finished first, or an unfinished folder is in the way
            if not os.path.isfile(os.path.join(final, "ready")):
                shutil.rmtree(final, ignore_errors=True)
                os.rename(work, final)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return final


def _go_version(go: str) -> tuple[int, ...]:
    done = subprocess.run([go, "env", "GOVERSION"], stdin=subprocess.DEVNULL, capture_output=True, text=True)
    match = re.match(r"go(\d+)\.(\d+)", done.stdout.strip())
    return tuple(int(part) for part in match.groups()) if match else (0,)


def _fetch_go(engine: Engine, install: str) -> str:
    """The Go toolchain :data:`_GO_TOOLCHAIN` from the Go module proxy (the module Go itself
    switches to, ``golang.org/toolchain``), unpacked into the cache once; its ``go``."""
    import platform
    import urllib.error
    import urllib.request
    import zipfile

    home = os.path.join(cache_root(), f"go-{_GO_TOOLCHAIN}")
    go = os.path.join(home, "bin", "go")
    if os.path.isfile(go):
        return go
    arch = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(platform.machine().lower())
    proxy = next((p for p in re.split(r"[,|]", os.environ.get("GOPROXY", "https://proxy.golang.org"))
                  if p.startswith("http")), None)
    hint = (f"install Go {_GO_TOOLCHAIN} or newer (https://go.dev/doc/install) and run `{install}`, or pass "
            "--prism_location=PATH of a prism binary")
    if arch is None or proxy is None:
        why = f"GOPROXY={os.environ.get('GOPROXY')} names no proxy" if arch else f"no Go for {platform.machine()}"
        raise ConfigError(f"--runner {engine.runner}: building {engine.title} needs Go {_GO_TOOLCHAIN}+, which is not "
                          f"on PATH, and {why}; {hint}")
    module = f"v0.0.1-go{_GO_TOOLCHAIN}.{platform.system().lower()}-{arch}"
    url = f"{proxy.rstrip('/')}/golang.org/toolchain/@v/{module}.zip"
    _announce(f"fetching Go {_GO_TOOLCHAIN} from {proxy} into {cache_root()} (once, to build {engine.title})")
    work = tempfile.mkdtemp(prefix=".go-", dir=cache_root())
    try:
        archive = os.path.join(work, "go.zip")
        with urllib.request.urlopen(url, timeout=60) as response, open(archive, "wb") as handle:
            shutil.copyfileobj(response, handle, 1 << 20)
        prefix = f"golang.org/toolchain@{module}/"
        with zipfile.ZipFile(archive) as zipped:
            for member in zipped.infolist():
                name = member.filename[len(prefix):] if member.filename.startswith(prefix) else ""
                if not name or name.endswith("/") or ".." in name.split("/"):
                    continue
                target = os.path.join(work, "go", name)
                os.makedirs(os.path.dirname(target), exist_ok=True)
                with zipped.open(member) as source, open(target, "wb") as handle:
                    shutil.copyfileobj(source, handle)
                if name.startswith(("bin/", "pkg/tool/")):
                    os.chmod(target, 0o755)
        os.rename(os.path.join(work, "go"), home)
    except (OSError, zipfile.BadZipFile, urllib.error.URLError) as exc:
        if os.path.isfile(go):  # another process unpacked it first
            return go
        raise ConfigError(f"--runner {engine.runner}: building {engine.title} needs Go {_GO_TOOLCHAIN}+, which is not "
                          f"on PATH, and fetching {url} failed ({exc}); {hint}") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return go


def _build_prism(engine: Engine, directory: str) -> None:
    version = _beam_version()
    install = f"go install {_PRISM_PACKAGE}@v{version}"
    go = shutil.which("go")
    env = {**os.environ, "GOBIN": directory}
    if go is not None and _go_version(go) >= (1, 21):
        env.setdefault("GOTOOLCHAIN", "auto")  # Go fetches the toolchain Beam's module asks for
    else:  # no Go, or one older than toolchain switching (Debian 12's is 1.19)
        go = _fetch_go(engine, install)
        env["GOTOOLCHAIN"] = "local"
    _announce(f"building {engine.title} {version} into {cache_root()} (go install, once)")
    done = subprocess.run([go, "install", f"{_PRISM_PACKAGE}@v{version}"], env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True)
    if done.returncode != 0 or not os.path.isfile(os.path.join(directory, "prism")):
        why = last_error_line(done.stderr + done.stdout)
        raise ConfigError(f"--runner {engine.runner}: `{install}` failed: {why}")


def _pom(engine: Engine) -> str:
    dependencies = "".join(
        f"<dependency><groupId>{group}</groupId><artifactId>{artifact}</artifactId><version>{version}</version>"
        "</dependency>\n" for group, artifact, version in engine.dependencies)
    return ("<project xmlns=\"http://maven.apache.org/POM/4.0.0\">\n<modelVersion>4.0.0</modelVersion>\n"
            f"<groupId>lmshards.engines</groupId><artifactId>{engine.name}-job-server</artifactId>"
            f"<version>1</version><packaging>pom</packaging>\n<dependencies>\n{dependencies}</dependencies>\n"
            "</project>\n")


def _build_job_server(engine: Engine, directory: str) -> None:
    missing = [tool for tool in ("java", "mvn") if shutil.which(tool) is None]
    coordinates = ", ".join(":".join(d) for d in engine.dependencies)
    if missing:
        raise ConfigError(f"--runner {engine.runner}: fetching {engine.title} needs Java 11+ and Maven, and "
                          f"{' and '.join(f'`{t}`' for t in missing)} is not on PATH; install them (for example "
                          "`apt-get install openjdk-17-jre-headless maven`) and run `python -m pipelines.engines "
                          f"fetch {engine.name}`")
    _announce(f"fetching {engine.title} (Beam {JOB_SERVER_BEAM_VERSION}) into {cache_root()} (Maven, once)")
    with open(os.path.join(directory, "pom.xml"), "w") as handle:
        handle.write(_pom(engine))
    done = subprocess.run([shutil.which("mvn"), "-B", "-q", "-f", os.path.join(directory, "pom.xml"),
                           "dependency:copy-dependencies", f"-DoutputDirectory={os.path.join(directory, 'lib')}"],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if done.returncode != 0:
        raise ConfigError(f"--runner {engine.runner}: Maven could not fetch {coordinates}: "
                          f"{last_error_line(done.stdout + done.stderr)}; check that Maven reaches its repository "
                          f"(a mirror or proxy goes in ~/.m2/settings.xml), then run `python -m pipelines.engines "
                          f"fetch {engine.name}`")


def fetch(name: str) -> str:
    """Fetch or build engine ``name`` (``prism``, ``flink``, ``spark``) into the cache, once; the
    folder it is in.

    Raises:
        ConfigError: a tool it needs is missing, or the fetch or build failed (one line).
    """
    engine = _BY_NAME[name]
    builder = _build_prism if name == "prism" else _build_job_server
    return _install(engine, lambda directory: builder(engine, directory))


def main(argv: list[str] | None = None) -> int:
    """``python -m pipelines.engines fetch prism|flink|spark ...``: fill the cache (CI warms it so)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    names = argv[1:] or list(_BY_NAME)
    if not argv or argv[0] != "fetch" or any(name not in _BY_NAME for name in names):
        print(f"usage: python -m pipelines.engines fetch [{'|'.join(_BY_NAME)} ...]", file=sys.stderr)
        return 2
    for name in names:
        try:
            print(fetch(name))
        except ConfigError as exc:
            print(f"lmshards engines: error: {exc}", file=sys.stderr)
            return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
