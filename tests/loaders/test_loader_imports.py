"""Import rules of loaders/ (docs/design.md section 1), checked in fresh interpreters."""

from __future__ import annotations

from lmshards_testing import run_with_blocked_imports


def test_numpy_side_of_loaders_imports_without_torch():
    code = (
        "import loaders, loaders.order, loaders.state, loaders.collate, loaders.shards, loaders.files, "
        "loaders.dynamic, loaders.errors, loaders.arrow_shard, loaders.segment_table, loaders.tar_shard, "
        "loaders.prefetch, loaders.collate_decoder, loaders.collate_encoder\n"
        "assert 'torch' not in sys.modules\n"
        "try:\n    loaders.ShardedDataset\nexcept ImportError as e:\n    assert 'torch' in str(e)\n"
        "print('ok')\n"
    )
    result = run_with_blocked_imports(code, "torch,apache_beam,webdataset")
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]


def test_loaders_import_only_objectives_and_shard_format_from_transforms():
    code = (
        "import loaders, loaders.dataset, loaders.mixture, loaders.dataloader\n"
        "loaders.ShardedDataset, loaders.MixtureDataset, loaders.make_dataloader\n"
        "bad = sorted(m for m in sys.modules if m.startswith('transforms.') and not "
        "(m.startswith('transforms.objectives') or m == 'transforms.shard_format'))\n"
        "assert not bad, bad\n"
        "print('ok')\n"
    )
    result = run_with_blocked_imports(code, "apache_beam")
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]


def test_loaders_import_without_the_training_stack():
    """transformers, lightning, torchdata and accelerate are [dev] extras: the loader needs none of
    them, and the HF integration imports transformers only when its trainer is used."""
    code = (
        "import loaders, loaders.dataset, loaders.dataloader, loaders.collate, loaders.masks, loaders.progress\n"
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


def test_names_moved_out_of_a_module_stay_importable_from_it():
    """shards.py, cache.py and collate.py were split by responsibility; code and recipes that import
    from the old modules get the same objects as from the new homes."""
    import loaders.arrow_shard
    import loaders.cache
    import loaders.collate
    import loaders.collate_decoder
    import loaders.collate_encoder
    import loaders.prefetch
    import loaders.segment_table
    import loaders.shards
    import loaders.tar_shard

    moved = {
        loaders.shards: [(loaders.arrow_shard, "ArrowShard"), (loaders.segment_table, "SegmentTable")]
        + [(loaders.tar_shard, n) for n in ("FieldSpec", "decode_npy", "field_specs", "iter_tar_shard",
                                            "read_tar_rows")],
        loaders.cache: [(loaders.prefetch, "Prefetcher")],
        loaders.collate: [(loaders.collate_decoder, "CausalCollator"), (loaders.collate_decoder, "PrefixLMCollator"),
                          (loaders.collate_encoder, "MLMCollator"), (loaders.collate_encoder, "Seq2SeqCollator")],
    }
    for old, names in moved.items():
        for home, name in names:
            assert name in old.__all__, (old.__name__, name)
            assert getattr(old, name) is getattr(home, name), (old.__name__, name)
            assert getattr(home, name).__module__ == home.__name__, (home.__name__, name)
