"""Import rules of loaders/ (docs/design.md section 1), checked in fresh interpreters."""

from __future__ import annotations

from lmshards_testing import run_with_blocked_imports


def test_numpy_side_of_loaders_imports_without_torch():
    code = (
        "import loaders, loaders.streaming.order, loaders.streaming.state, loaders.collation.collate, "
        "loaders.access.shards, loaders.access.files, loaders.dynamic, loaders.errors, loaders.access.arrow_shard, "
        "loaders.access.segment_table, loaders.access.tar_shard, loaders.access.prefetch, "
        "loaders.collation.collate_decoder, loaders.collation.collate_encoder\n"
        "assert 'torch' not in sys.modules\n"
        "try:\n    loaders.ShardedDataset\nexcept ImportError as e:\n    assert 'torch' in str(e)\n"
        "print('ok')\n"
    )
    result = run_with_blocked_imports(code, "torch,apache_beam,webdataset")
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]


def test_loaders_import_only_objectives_and_shard_format_from_transforms():
    code = (
        "import loaders, loaders.dataset, loaders.mixture, loaders.streaming.dataloader\n"
        "loaders.ShardedDataset, loaders.MixtureDataset, loaders.make_dataloader\n"
        "bad = sorted(m for m in sys.modules if m.startswith('transforms.') and not "
        "(m.startswith('transforms.objectives') or m == 'transforms.writing.shard_format'))\n"
        "assert not bad, bad\n"
        "print('ok')\n"
    )
    result = run_with_blocked_imports(code, "apache_beam")
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]


def test_loaders_import_without_the_training_stack():
    """transformers, lightning, torchdata and accelerate are [dev] extras: the loader needs none of
    them, and the HF integration imports transformers only when its trainer is used."""
    code = (
        "import loaders, loaders.dataset, loaders.streaming.dataloader, loaders.collation.collate, "
        "loaders.collation.masks, loaders.streaming.progress\n"
        "import loaders.integrations.hf as hf\n"
        "loaders.make_dataloader, hf.LMShardsTrainerMixin, hf.LOADER_STATE_NAME\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('transformers', 'lightning', 'torchdata', "
        "'accelerate', 'pytorch_lightning'))\n"
        "assert not bad, bad\n"
        "try:\n    hf.LMShardsTrainer\nexcept ImportError as e:\n    assert 'transformers' in str(e)\n"
        "else:\n    raise AssertionError('LMShardsTrainer without transformers')\n"
        "print('ok')\n"
    )
    result = run_with_blocked_imports(code, "apache_beam,transformers,lightning,torchdata,accelerate")
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]
