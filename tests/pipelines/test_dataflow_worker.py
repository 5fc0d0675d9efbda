"""The package a default Dataflow job stages, installed the way a Dataflow worker installs it,
runs the job's stages with the plan the launcher made.

A dry run of the default job (``--runner DataflowRunner --dry_run=True --no_auth``) plans it
here (fastokens, when its probe passes) and builds the wheel it stages. A fresh virtual
environment then plays Beam's SDK container: Apache Beam at the launcher's version (the
container has it), then the staged wheel as the container installs an ``--extra_package``
(``pip install --upgrade --force-reinstall --no-deps``, then ``pip install`` to resolve its
requirements from the registry), with no checkout anywhere on the path. There every DoFn and
CombineFn of ours that the job pickled is unpickled and set up, Tokenize encodes a bundle, and
the installed ``lmshards`` command runs the same job on the local runner: the ids and the
shards are the launcher's.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys

import pytest
from lmshards_testing import ROOT, TOKENIZER, encode_documents, file_digests, materialize

from pipelines.dataflow import PACKAGES

FAQ = str(ROOT / "data" / "sample" / "faq.jsonl")
DATAFLOW = ["--runner", "DataflowRunner", "--dry_run=True", "--no_auth", "--project", "lmshards-test",
            "--region", "us-central1", "--temp_location", "gs://lmshards-test/tmp"]

#: Texts for Tokenize's bundle: ASCII, accents, CJK, an emoji, whitespace runs.
TEXTS = ["Hello world, this is lmshards.", "Déjà vu: naïve café.", "数据预处理 and 文本", "tabs\tand  spaces 🙂",
         "A longer sentence. And a second one! Is there a third?"]
JOB = ["--input", FAQ, "--tokenizer", TOKENIZER, "--objective", "clm", "--seq-len", "128", "--num-shards", "2"]

#: Run in an environment (``sys.argv[1]``: a JSON spec): unpickle the job's functions as a
#: worker does, set each up, send ``TEXTS`` through Tokenize as one bundle; print what it saw.
_WORKER = r"""
import importlib.metadata, json, sys
import numpy as np
from apache_beam.internal import pickler
from apache_beam.pvalue import TaggedOutput
from apache_beam.utils.windowed_value import WindowedValue
import pipelines
from transforms.elements import DocumentBatch

spec = json.load(open(sys.argv[1]))
functions = {}
for name, path in spec["functions"]:
    with open(path, "rb") as handle:
        loaded = pickler.loads(handle.read())
    function = loaded[0] if isinstance(loaded, tuple) else loaded
    function.setup()
    functions[name] = function
tokenize = functions[spec["tokenize"]]
tokenize.start_bundle()
outputs = [o for text in spec["texts"] for o in tokenize.process(text)]
outputs += list(tokenize.finish_bundle())
ids = {}
for output in outputs:
    if isinstance(output, TaggedOutput):
        continue
    split, encoded = output.value if isinstance(output, WindowedValue) else output
    batch = DocumentBatch.decode(encoded)
    for index in range(batch.count):
        document = batch.document(index)
        ids[document.key.hex()] = document.ids.tolist()
for function in functions.values():
    function.teardown()
print("WORKER " + json.dumps({
    "pipelines": pipelines.__file__, "lmshards": importlib.metadata.version("lmshards"),
    "backend": tokenize._backend, "encoder": type(tokenize._encoder).__name__, "set_up": sorted(functions),
    "ids": ids, "versions": {d.metadata["Name"]: d.version for d in importlib.metadata.distributions()},
}))
"""


def _pickled_functions(job) -> dict[str, bytes]:
    """The pickled DoFns (ParDo payloads) and CombineFns of ours in a job's pipeline, by step name."""
    from apache_beam.internal import pickler
    from apache_beam.portability import python_urns
    from apache_beam.portability.api import beam_runner_api_pb2

    found = {}
    for transform in job.proto_pipeline.components.transforms.values():
        if transform.spec.urn == "beam:transform:pardo:v1":
            spec = beam_runner_api_pb2.ParDoPayload.FromString(transform.spec.payload).do_fn
        elif transform.spec.urn == "beam:transform:combine_per_key:v1":
            spec = beam_runner_api_pb2.CombinePayload.FromString(transform.spec.payload).combine_fn
        else:
            continue
        if spec.urn not in (python_urns.PICKLED_DOFN_INFO, python_urns.PICKLED_COMBINE_FN):
            continue
        loaded = pickler.loads(spec.payload)
        function = loaded[0] if isinstance(loaded, tuple) else loaded
        if type(function).__module__.split(".")[0] in PACKAGES:
            found[transform.unique_name] = spec.payload
    return found


def _clean_env() -> dict[str, str]:
    """This process's environment without anything that puts a checkout on the path."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}


def _worker_environment(root, wheel: str, cwd) -> str:
    """A fresh virtual environment set up as Beam's SDK container installs an extra package; its python."""
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True, cwd=cwd, env=_clean_env())
    python = os.path.join(root, "bin", "python")
    pip = [python, "-m", "pip", "--disable-pip-version-check", "install", "--quiet"]
    for command in ([f"apache-beam=={importlib.metadata.version('apache-beam')}"],  # the container's SDK
                    ["--upgrade", "--force-reinstall", "--no-deps", wheel], [wheel]):
        done = subprocess.run([*pip, *command], cwd=cwd, env=_clean_env(), capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-3000:]
    return python


def _run_worker(python: str, spec_path, cwd, env) -> dict:
    done = subprocess.run([python, "-c", _WORKER, str(spec_path)], cwd=cwd, env=env, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("WORKER ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    return json.loads(lines[-1][len("WORKER "):])


@pytest.mark.e2e
def test_the_staged_wheel_installed_as_a_worker_does_runs_the_planned_job(tmp_path):
    from apache_beam.options.pipeline_options import SetupOptions

    from pipelines.materialize import run_job

    manifest, result = run_job([*JOB, "--output", str(tmp_path / "planned"), *DATAFLOW])
    assert manifest is None
    wheels = [p for p in result.job.options.view_as(SetupOptions).extra_packages or [] if "lmshards-" in p]
    assert len(wheels) == 1
    functions = _pickled_functions(result.job)
    tokenize = [name for name in functions if name.startswith("Tokenize/")]
    # Tokenize, and the job's other DoFns (read, groups, pack, build, write, manifest, rejected...)
    assert len(tokenize) == 1 and len(functions) >= 9
    paths = []
    for index, (name, payload) in enumerate(sorted(functions.items())):
        (tmp_path / f"function-{index}.pickle").write_bytes(payload)
        paths.append((name, str(tmp_path / f"function-{index}.pickle")))
    # A job that is not a dry run writes its resolved tokenizer into the output before it starts;
    # Tokenize's setup reads it there. A local run of the same job writes that same file.
    local = materialize(tmp_path / "launcher-out", *JOB, "--progress-seconds", "0")
    (tmp_path / "planned").mkdir()
    (tmp_path / "planned" / "tokenizer.json").write_bytes((tmp_path / "launcher-out" / "tokenizer.json").read_bytes())
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"functions": paths, "tokenize": tokenize[0], "texts": TEXTS}))

    worker_dir = tmp_path / "worker"  # no checkout here, nor on the path
    worker_dir.mkdir()
    python = _worker_environment(tmp_path / "venv", wheels[0], worker_dir)
    worker = _run_worker(python, spec, worker_dir, _clean_env())
    launcher = _run_worker(sys.executable, spec, ROOT, dict(os.environ))

    assert worker["pipelines"].startswith(str(tmp_path / "venv")), worker["pipelines"]
    assert worker["lmshards"] == os.path.basename(wheels[0]).split("-")[1]
    # The job was planned with fastokens, and the worker encodes with it.
    assert launcher["backend"] == worker["backend"] == "fastokens"
    assert worker["encoder"] == launcher["encoder"] == "FastokensEncoder"
    assert worker["set_up"] == launcher["set_up"] == sorted(functions)
    assert worker["ids"] == launcher["ids"] and len(worker["ids"]) == len(TEXTS)
    assert sorted(worker["ids"].values()) == sorted(ids.tolist() for ids in encode_documents(TEXTS, TOKENIZER))
    # Every core requirement is installed at the launcher's version.
    for name in ("apache-beam", "fastokens", "tokenizers", "tqdm", "pyarrow", "numpy", "zstandard", "PyYAML"):
        assert worker["versions"][name] == importlib.metadata.version(name), name
    assert "torch" not in worker["versions"]

    # The installed command runs the same job on the local runner: the launcher's bytes.
    out = tmp_path / "worker-out"
    done = subprocess.run([os.path.join(tmp_path, "venv", "bin", "lmshards"), "materialize", *JOB, "--output",
                           str(out), "--progress-seconds", "0"], cwd=worker_dir, env=_clean_env(),
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert file_digests(out) == file_digests(tmp_path / "launcher-out")
    worker_manifest = json.loads((out / "manifest.json").read_text())
    assert worker_manifest["run"]["encoder"]["backend"] == local.run["encoder"]["backend"] == "fastokens"
