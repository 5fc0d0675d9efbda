"""lmshards: raw text -> deterministic, sharded pretraining examples (Apache Beam)."""

from setuptools import find_packages, setup

setup(
    name="lmshards",
    version="0.1.0",
    description="Turn raw text corpora into sharded pretraining examples with Apache Beam",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["pipelines", "pipelines.*", "transforms", "transforms.*", "schemas",
                                    "schemas.*", "loaders", "loaders.*"]),
    install_requires=[
        # Up to the Beam release the whole suite (engines, evidence of Beam's own faults, byte
        # identity across runners) last ran on; a newer one is taken after the suite passes on it.
        "apache-beam>=2.60,<2.78",
        "pyarrow>=14",
        "tokenizers>=0.20",
        # The fast exact encoder (transforms/tokenizing/encoder.py); lmshards runs without it (HF tokenizers).
        "fastokens>=0.3.5,<0.4",
        "numpy>=1.24",
        "zstandard>=0.21",
        "pyyaml>=6",
        "tqdm>=4.60",  # the progress bar of an in-process run on a terminal
    ],
    extras_require={
        "torch": ["torch>=2.1"],
        # What the README's training recipes import: the torch loop and HF Trainer recipes build
        # transformers models (Trainer needs accelerate); the Lightning recipe trains one in Lightning.
        "hf": ["torch>=2.1", "transformers>=5.0,<6", "accelerate>=1.1,<2"],
        "lightning": ["torch>=2.1", "transformers>=5.0,<6", "lightning>=2.4,<3"],
        "webdataset": ["webdataset>=0.2.86"],
        # build and setuptools build the wheel lmshards stages for Dataflow workers (pipelines/dataflow.py).
        "gcp": ["apache-beam[gcp]>=2.60,<2.78", "build", "setuptools>=61"],
        # Remote datasets for the loader: fsspec URLs, gs:// through gcsfs (s3:// needs s3fs).
        "remote": ["fsspec>=2023.1", "gcsfs>=2023.1"],
        "dev": [
            "pytest>=8",
            "pytest-xdist>=3.5",  # the suite runs in one process per core (pyproject.toml's addopts)
            "hypothesis>=6.100",
            "ruff>=0.5",
            "datasets>=2.18",
            "webdataset>=0.2.86",
            "gcp-storage-emulator>=2024.8.3",
            "fsspec>=2023.1",
            "gcsfs>=2023.1",
            "apache-beam[gcp]>=2.60,<2.78",
            "build",
            "setuptools>=61",
            # Training-stack interop tests (tiny models from configs; the versions tested).
            "transformers>=5.0,<6",
            "accelerate>=1.1,<2",
            "lightning>=2.4,<3",
            "torchdata>=0.10,<0.12",
            # The DaskRunner evidence test (tests/pipelines/test_runner_flags.py): lmshards refuses that runner.
            "dask>=2024.4.2",
            "distributed>=2024.4.2",
        ],
    },
    entry_points={"console_scripts": ["lmshards = pipelines.cli:main"]},
)
