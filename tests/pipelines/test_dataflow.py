"""Dataflow jobs built with ``--dry_run``: lmshards ships itself, and no shuffle of documents
or examples has a key space fixed independently of the corpus.

A dry run builds the whole job (translation, pickling, the environment and what it stages)
without submitting it; no Google Cloud access is needed (``--no_auth``, local inputs).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
import zipfile

import pytest
from lmshards_testing import ROOT, run_with_blocked_imports

from pipelines.dataflow import PACKAGES, build_wheel, pinned_requirements, ships_itself

FAQ = str(ROOT / "data" / "sample" / "faq.jsonl")
TOKENIZER = str(ROOT / "data" / "tokenizer.json")
DATAFLOW = ["--runner", "DataflowRunner", "--dry_run=True", "--no_auth", "--project", "lmshards-test",
            "--region", "us-central1", "--temp_location", "gs://lmshards-test/tmp"]

#: Prints what a dry run of ``sys.argv[1:]`` would stage for the workers and what the wheel of
#: lmshards among them holds.
_DRY_RUN = """
import json, sys, zipfile
from apache_beam.options.pipeline_options import SetupOptions
from apache_beam.portability.api import beam_runner_api_pb2
from pipelines.materialize import run_job

manifest, result = run_job(sys.argv[1:])
staged = set()
for environment in result.job.proto_pipeline.components.environments.values():
    for dependency in environment.dependencies:
        role = beam_runner_api_pb2.ArtifactStagingToRolePayload.FromString(dependency.role_payload)
        staged.add(role.staged_name)
extra_packages = result.job.options.view_as(SetupOptions).extra_packages or []
wheels = [p for p in extra_packages if "lmshards-" in p]
names, metadata = [], ""
for path in wheels:
    with zipfile.ZipFile(path) as wheel:
        names = wheel.namelist()
        metadata = wheel.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
print("DRY-RUN " + json.dumps({"manifest": manifest, "staged": sorted(staged), "wheel_files": names,
                               "metadata": metadata, "extra_packages": [p.rsplit("/", 1)[-1] for p in extra_packages]}))
"""


def _dry_run(cwd, *args, python=sys.executable):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([python, "-c", _DRY_RUN, *args], cwd=cwd, env=env, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("DRY-RUN ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    return json.loads(lines[-1][len("DRY-RUN "):])


def _job_args(out, *extra):
    return ["--input", FAQ, "--tokenizer", TOKENIZER, "--output", str(out), "--objective", "clm", "--seq-len", "128",
            *DATAFLOW, *extra]


def _release_wheel(directory) -> str:
    """A wheel of this checkout as ``python -m build --wheel`` makes a release (setup.py's ranges,
    version 0.1.0), built from a copy so the checkout gains no build debris; its path."""
    import shutil

    import build
    import pyproject_hooks

    source = os.path.join(directory, "source")
    for name in ("setup.py", "pyproject.toml", "README.md"):
        os.makedirs(source, exist_ok=True)
        shutil.copyfile(ROOT / name, os.path.join(source, name))
    for package in PACKAGES:
        shutil.copytree(ROOT / package, os.path.join(source, package), ignore=shutil.ignore_patterns("__pycache__"))
    builder = build.ProjectBuilder(source, runner=pyproject_hooks.quiet_subprocess_runner)
    return builder.build("wheel", os.path.join(directory, "dist"))


def _plugin_wheel(directory) -> str:
    """A wheel of the example objective plugin (tests/plugin_example), built from a copy; its path."""
    import shutil

    import build
    import pyproject_hooks

    source = os.path.join(directory, "source")
    shutil.copytree(ROOT / "tests" / "plugin_example", source)
    builder = build.ProjectBuilder(source, runner=pyproject_hooks.quiet_subprocess_runner)
    return builder.build("wheel", os.path.join(directory, "dist"))


def _installed_from_a_wheel(root) -> str:
    """A virtual environment where lmshards is installed from its release wheel (as ``pip install``
    does for a pure-Python wheel: unpacked into site-packages, no checkout), with this one's
    libraries beside it; its python."""
    import sysconfig
    import venv

    venv.EnvBuilder(with_pip=False).create(root)
    python = os.path.join(root, "bin", "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    with zipfile.ZipFile(_release_wheel(os.path.join(root, "release"))) as wheel:
        wheel.extractall(site)
    # this environment's libraries, as a plain path entry: its editable lmshards finder stays out
    with open(os.path.join(site, "libraries.pth"), "w") as handle:
        handle.write(sysconfig.get_paths()["purelib"] + "\n")
    return python


@pytest.mark.e2e
def test_a_dry_run_outside_the_repository_stages_the_installed_lmshards(tmp_path):
    python = _installed_from_a_wheel(tmp_path / "venv")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    assert not str(outside).startswith(str(ROOT))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    where = subprocess.run([python, "-c", "import pipelines; print(pipelines.__file__)"], cwd=outside, env=env,
                           capture_output=True, text=True, check=True).stdout
    assert where.startswith(str(tmp_path / "venv"))  # not the checkout
    # An objective plugin's wheel (tests/plugin_example) ships only itself: lmshards stages its own first.
    plugin = _plugin_wheel(tmp_path / "plugin")
    result = _dry_run(outside, *_job_args(tmp_path / "out", "--extra_package", plugin), python=python)
    assert result["manifest"] is None
    wheels = [name for name in result["staged"] if name.startswith("lmshards-")]
    assert len(wheels) == 1 and re.fullmatch(r"lmshards-0\.1\.0\+src[0-9a-f]{12}-py3-none-any\.whl", wheels[0])
    assert result["extra_packages"] == [wheels[0], "lmshards_tagged_clm-0.1.0-py3-none-any.whl"]
    assert "lmshards_tagged_clm-0.1.0-py3-none-any.whl" in result["staged"]
    assert wheels[0] == os.path.basename(build_wheel(str(tmp_path)))  # the same modules as here
    assert "extra_packages.txt" in result["staged"]
    files = set(result["wheel_files"])
    for module in ("pipelines/materialize.py", "transforms/packing/pack.py", "transforms/objectives/bart.py",
                   "schemas/manifest.py", "loaders/dataset.py"):
        assert module in files
    requires = [line.split(": ", 1)[1] for line in result["metadata"].splitlines() if line.startswith("Requires-Dist")]
    assert requires == pinned_requirements()
    # every core requirement of setup.py, pinned to the version installed here; no extra's
    assert requires == [f"{name}=={importlib.metadata.version(name)}" for name in (
        "apache-beam", "pyarrow", "tokenizers", "fastokens", "numpy", "zstandard", "pyyaml", "tqdm")]
    assert not (tmp_path / "out").exists()  # a dry run writes nothing


def test_the_pins_are_the_metadata_core_requirements_at_the_installed_versions(tmp_path):
    info = tmp_path / "lmshards-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: lmshards\nVersion: 0.1.0\nRequires-Dist: tokenizers>=0.20\n"
        "Requires-Dist: PyYAML>=6\nRequires-Dist: lmshards-no-such-package>=1.2\n"
        'Requires-Dist: numpy>=1.24; python_version >= "3.10"\nRequires-Dist: torch>=2.1; extra == "torch"\n'
        'Requires-Dist: pywin32>=300; sys_platform == "win32"\n')
    version = importlib.metadata.version
    assert pinned_requirements(importlib.metadata.PathDistribution(info)) == [
        f"tokenizers=={version('tokenizers')}", f"PyYAML=={version('pyyaml')}",
        "lmshards-no-such-package>=1.2",  # not installed here: the job was not planned with it
        f'numpy=={version("numpy")}; python_version >= "3.10"']


def test_without_build_staging_is_a_one_line_configuration_error():
    done = run_with_blocked_imports(
        "from pipelines.dataflow import StagingError, stage_installed_package\n"
        "try:\n    stage_installed_package(['--runner', 'DataflowRunner'])\n"
        "except StagingError as exc:\n    print('REFUSED', exc.exit_code, str(exc))\n", "build")
    assert done.returncode == 0, done.stderr[-2000:]
    line = done.stdout.strip()
    assert line.startswith("REFUSED 2 lmshards: building the wheel it stages for the Dataflow workers needs the "
                           "'build' package") and "--setup_file" in line and "\n" not in line


#: The jobs below ship the code in an image of their own: the graph does not depend on how the
#: code reaches the workers, and no wheel is built for them (the staged wheel is tested above).
OWN_IMAGE = ("--sdk_container_image", "gcr.io/p/lmshards:1")


@pytest.fixture(scope="module")
def dry_run_job(tmp_path_factory):
    """``job(objective, *extra)``: Beam's result of a dry run with :data:`OWN_IMAGE`, each built
    once per module."""
    from pipelines.materialize import run_job

    jobs = {}

    def job(objective: str, *extra: str):
        if (objective, extra) not in jobs:
            args = _job_args(tmp_path_factory.mktemp("dry-run") / "out", *OWN_IMAGE, *extra)
            args[args.index("clm")] = objective
            manifest, jobs[objective, extra] = run_job(args)
            assert manifest is None
        return jobs[objective, extra]

    return job


def _staged(result) -> list[str]:
    """The names of what a dry run's job stages for the workers."""
    from apache_beam.portability.api import beam_runner_api_pb2

    staged = set()
    for environment in result.job.proto_pipeline.components.environments.values():
        for dependency in environment.dependencies:
            role = beam_runner_api_pb2.ArtifactStagingToRolePayload.FromString(dependency.role_payload)
            staged.add(role.staged_name)
    return sorted(staged)


def test_a_user_who_ships_the_code_is_left_alone(dry_run_job):
    assert ships_itself(["--runner", "DataflowRunner"]) and ships_itself(["--runner=DataflowRunner"])
    assert not ships_itself(["--runner", "FnApiRunner"]) and not ships_itself([])
    for flag in ("--setup_file=./setup.py", "--extra_package=dist/lmshards-0.1.0-py3-none-any.whl",
                 "--extra_packages=lmshards-0.1.0.tar.gz", "--requirements_file=r.txt",
                 "--sdk_container_image=gcr.io/p/lmshards:1"):
        assert not ships_itself(["--runner", "DataflowRunner", flag]), flag
        assert not ships_itself(["--runner", "DataflowRunner", *flag.split("=", 1)]), flag
    # A package that is not lmshards (an objective plugin's wheel) ships only itself: lmshards still stages its own.
    for flag in ("--extra_package=dist/lmshards_fim-0.1-py3-none-any.whl", "--extra_packages=x.whl"):
        assert ships_itself(["--runner", "DataflowRunner", flag]), flag
        assert ships_itself(["--runner", "DataflowRunner", *flag.split("=", 1)]), flag
    assert not ships_itself(["--runner", "DataflowRunner", "--extra_package", "x.whl", "--extra_package",
                             "lmshards-0.1.0-py3-none-any.whl"])
    staged = _staged(dry_run_job("clm"))
    assert staged and not [name for name in staged if name.startswith("lmshards-")]


#: Every GroupByKey of the job, by name, and why its key space is what it is. Those that carry
#: documents, examples or rejected records have keys that grow with the corpus: each is keyed
#: by the step named here (a key the graph alone cannot size is tested where it is made); the
#: others carry small aggregates.
GROWS_WITH_THE_CORPUS = {
    "ReadCorpus/SpreadFiles": ("ReadCorpus/SpreadFiles/", "random keys (Reshuffle) of file names"),
    "ReadCorpus/SpreadTasks": ("ReadCorpus/SpreadTasks/", "random keys (Reshuffle) of read tasks: byte ranges, "
                               "row groups (tests/transforms/test_splits.py)"),
    "Pack/GroupByPackGroup": ("AssignGroups/GroupOfBucket",
                              "(split, pack group): a group per --pack-group-tokens tokens (tests/transforms/"
                              "test_group.py)"),
    "BuildExamples/SpreadBlocks": ("BuildExamples/SpreadBlocks/", "random keys (Reshuffle) of chunk blocks"),
    "WriteShards/GroupByShard": ("WriteShards/AllPieces", "(split, shard): a shard per --shard-size-mb of examples "
                                 "(test_shard_size_mb_sizes_each_split_from_its_document_tokens)"),
    "WriteRejected/GroupRejected": ("WriteRejected/KeyRejected", "a file per 262,144 rejected records "
                                    "(tests/transforms/test_write_rejected.py)"),
}
SMALL_AGGREGATES = {
    "ReadCorpus/FixLinePositions/LinesPerFile": "a line count per byte range, keyed by file",
    "Pack/GroupRemainders": "one remainder, shorter than a chunk, per pack group, keyed by split",
    "PlanGroups/SumBucketTokens": "a token count per (split, sub-bucket)",
    "PlanGroups/CutIntoGroups": "the token counts of 2**20 sub-buckets per split",
    "TokensPerSplit": "a token count per split",
    "SumStatistics": "counters: the reader's, Pack's and the objective's per split, and per (split, source) of "
                     "--source-field: as many keys as sources, not documents",
    "WriteRejected/CountReasons": "a count per reason",
    "WriteRejected/CountRejected": "a count",
}


def _fixed_key_spaces(result) -> tuple[set[str], list[str]]:
    """(the data-carrying GroupByKeys of a dry run's job, those not keyed as above)."""
    components = result.job.proto_pipeline.components
    producer = {pcoll: t.unique_name for t in components.transforms.values() if not t.subtransforms
                for pcoll in t.outputs.values()}
    data, fixed = set(), []
    for transform in components.transforms.values():
        if transform.spec.urn != "beam:transform:group_by_key:v1":
            continue
        name = transform.unique_name
        owners = [prefix for prefix in (*GROWS_WITH_THE_CORPUS, *SMALL_AGGREGATES)
                  if name == prefix or name.startswith(prefix + "/")]
        assert len(owners) == 1, f"GroupByKey {name} is not accounted for"
        if owners[0] in GROWS_WITH_THE_CORPUS:
            data.add(owners[0])
            keyed_by = GROWS_WITH_THE_CORPUS[owners[0]][0]
            sources = [producer[pcoll] for pcoll in transform.inputs.values()]
            if not all(source == keyed_by or (keyed_by.endswith("/") and source.startswith(keyed_by))
                       for source in sources):
                fixed.append(f"{name} <- {sources}")
    return data, fixed


@pytest.mark.parametrize("objective", ["clm", "bart"])
def test_no_shuffle_of_data_has_a_key_space_fixed_by_the_defaults(dry_run_job, objective):
    data, fixed = _fixed_key_spaces(dry_run_job(objective))
    # bart builds in a stage of its own on Dataflow; clm builds where it packs
    assert data == set(GROWS_WITH_THE_CORPUS) - ({"BuildExamples/SpreadBlocks"} if objective == "clm" else set())
    assert fixed == []


def test_fixed_hash_buckets_are_seen_for_what_they_are(dry_run_job):
    """The check is not blind: with --num-buckets (an expert override) Pack's shuffle has 64 keys."""
    _, fixed = _fixed_key_spaces(dry_run_job("clm", "--num-buckets", "64"))
    assert fixed == ["Pack/GroupByPackGroup <- ['AssignBuckets/GroupOfBucket']"]
