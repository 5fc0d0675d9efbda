"""Tests of transforms/tokenizing/tokenizer_utils.py with the project tokenizer and a GPT-2-like one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from transforms.tokenizing.tokenizer_utils import (
    DEFAULT_NAMES,
    ROLE_CANDIDATES,
    byte_level_lengths,
    resolve_special_tokens,
    sentinel_token,
    tokenizer_from_bytes,
)

PROJECT_TOKENIZER = Path(__file__).resolve().parents[2] / "data" / "tokenizer.json"
ALL_ROLES = frozenset(ROLE_CANDIDATES)


def project_tokenizer() -> Tokenizer:
    return tokenizer_from_bytes(PROJECT_TOKENIZER.read_bytes(), str(PROJECT_TOKENIZER))


def gpt2_like_tokenizer() -> Tokenizer:
    """Byte-level BPE whose only special token is <|endoftext|> (id 0), like GPT-2."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    texts = ["the quick brown fox jumps over the lazy dog", "a tokenizer for tests", "hello world"] * 5
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def test_sentinel_token_names():
    assert sentinel_token(0) == "<extra_id_0>"
    assert sentinel_token(127) == "<extra_id_127>"


def test_project_tokenizer_ids():
    tokenizer = project_tokenizer()
    resolved = resolve_special_tokens(
        tokenizer, required=ALL_ROLES, num_sentinels=100, mode_tokens=("[R]", "[S]", "[X]")
    )
    special = resolved.special
    assert (special.pad, special.eos, special.bos, special.unk, special.mask) == (0, 1, 2, 3, 4)
    assert (special.cls, special.sep) == (2, 1)  # <s> and </s> frame BERT-style when asked
    assert special.sentinels == tuple(range(5, 105))
    assert special.sentinels[:3] == (5, 6, 7)
    assert special.mode_tokens == {"[R]": 133, "[S]": 134, "[X]": 135}
    assert special.vocab_size == 8000
    # Every added special token: 5 roles, 128 sentinels, 6 UL2 mode tokens.
    assert special.all_special == frozenset(range(139))
    assert resolved.roles == {
        "pad": "<pad>",
        "eos": "</s>",
        "bos": "<s>",
        "unk": "<unk>",
        "mask": "<mask>",
        "cls": "<s>",
        "sep": "</s>",
    }
    assert resolved.added == []
    assert tokenizer.token_to_id(sentinel_token(127)) is not None and tokenizer.token_to_id(sentinel_token(128)) is None
    assert special.non_special_ids()[:3].tolist() == [139, 140, 141]
    assert len(special.non_special_ids()) == 8000 - 139


def test_project_tokenizer_serialisation_is_stable():
    first = resolve_special_tokens(project_tokenizer())
    second = resolve_special_tokens(tokenizer_from_bytes(first.to_json_bytes()))
    assert first.to_json_bytes() == second.to_json_bytes()
    assert first.sha256() == second.sha256()
    assert len(first.sha256()) == 64
    assert second.special == first.special


def test_overrides_take_precedence():
    resolved = resolve_special_tokens(project_tokenizer(), overrides={"eos": "<extra_id_0>", "pad": "</s>"})
    assert resolved.special.eos == 5
    assert resolved.special.pad == 1
    assert resolved.roles["eos"] == "<extra_id_0>"


def test_override_of_missing_token_fails_or_is_added():
    with pytest.raises(ValueError, match=r"--special-token mask=<MASK>: token not in the tokenizer vocabulary"):
        resolve_special_tokens(project_tokenizer(), overrides={"mask": "<MASK>"})
    tokenizer = project_tokenizer()
    resolved = resolve_special_tokens(tokenizer, overrides={"mask": "<MASK>"}, add_missing=True)
    assert resolved.added == ["<MASK>"]
    assert resolved.special.mask == 8000
    assert resolved.special.vocab_size == 8001
    assert 8000 in resolved.special.all_special


def test_unknown_role_raises():
    with pytest.raises(ValueError, match=r"unknown role\(s\) \['eod'\]"):
        resolve_special_tokens(project_tokenizer(), overrides={"eod": "</s>"})


def test_sentinel_shortage_message():
    with pytest.raises(ValueError) as info:
        resolve_special_tokens(project_tokenizer(), num_sentinels=200)
    message = str(info.value)
    assert "200 sentinels <extra_id_0..199> are needed, it has 128" in message
    assert "--add-special-tokens" in message


def test_missing_mode_tokens_message():
    with pytest.raises(ValueError, match=r"tokens \['\[Q\]'\] the objective needs as single ids are missing"):
        resolve_special_tokens(project_tokenizer(), mode_tokens=("[R]", "[Q]"))


def test_sentinels_added_after_existing_ones():
    tokenizer = project_tokenizer()
    resolved = resolve_special_tokens(tokenizer, num_sentinels=130, mode_tokens=("[Q]",), add_missing=True)
    assert resolved.added == ["<extra_id_128>", "<extra_id_129>", "[Q]"]
    assert resolved.special.sentinels[127:] == (132, 8000, 8001)
    assert resolved.special.mode_tokens == {"[Q]": 8002}
    assert tokenizer.token_to_id(sentinel_token(129)) is not None and tokenizer.token_to_id(sentinel_token(130)) is None
    # The amended tokenizer is the one serialised next to the dataset.
    reloaded = tokenizer_from_bytes(resolved.to_json_bytes())
    assert reloaded.token_to_id("<extra_id_129>") == 8001
    assert reloaded.encode("x<extra_id_128>y", add_special_tokens=False).ids[1] == 8000


# --- a GPT-2-like tokenizer -----------------------------------------------------------------


def test_gpt2_like_eos_resolution_and_pad_fallback():
    tokenizer = gpt2_like_tokenizer()
    assert tokenizer.token_to_id("<|endoftext|>") == 0
    resolved = resolve_special_tokens(tokenizer)
    special = resolved.special
    assert special.eos == 0
    assert special.pad == 0  # no pad token: pad falls back to eos
    assert resolved.roles == {"eos": "<|endoftext|>", "pad": "<|endoftext|>"}
    assert (special.bos, special.unk, special.mask, special.cls, special.sep) == (None,) * 5
    assert special.sentinels == ()
    assert special.all_special == frozenset({0})
    assert special.vocab_size == tokenizer.get_vocab_size()
    assert resolved.added == []


def test_gpt2_like_missing_mask_raises_clear_error():
    with pytest.raises(ValueError) as info:
        resolve_special_tokens(gpt2_like_tokenizer(), required={"eos", "mask"})
    assert str(info.value) == (
        "the tokenizer has no mask token (tried <mask>, [MASK], <|mask|>); pass "
        "--special-token mask=TOKEN or --add-special-tokens to add <mask>"
    )


def test_gpt2_like_add_missing_adds_tokens():
    tokenizer = gpt2_like_tokenizer()
    vocab = tokenizer.get_vocab_size()
    resolved = resolve_special_tokens(
        tokenizer, required={"eos", "mask", "bos"}, num_sentinels=2, mode_tokens=("[S]",), add_missing=True
    )
    assert resolved.added == ["<s>", "<mask>", "<extra_id_0>", "<extra_id_1>", "[S]"]
    special = resolved.special
    assert special.eos == 0
    assert special.bos == vocab
    assert special.mask == vocab + 1
    assert special.sentinels == (vocab + 2, vocab + 3)
    assert special.mode_tokens == {"[S]": vocab + 4}
    assert special.vocab_size == vocab + 5
    assert special.cls == vocab  # "<s>" now exists and is a cls candidate
    assert special.all_special == frozenset({0, *range(vocab, vocab + 5)})
    assert DEFAULT_NAMES["mask"] == "<mask>"
    # Added tokens are single ids inside text, and decode back without the special ones.
    ids = tokenizer.encode("hello <mask> world", add_special_tokens=False).ids
    assert special.mask in ids
    assert tokenizer.decode(ids, skip_special_tokens=True).replace("  ", " ").strip() == "hello world"


def test_gpt2_like_missing_eos_not_required():
    tokenizer = Tokenizer(models.BPE())
    tokenizer.add_tokens(["a", "b"])
    resolved = resolve_special_tokens(tokenizer, required=frozenset())
    assert resolved.special.eos == -1 and resolved.special.pad == -1
    assert resolved.special.non_special_ids().tolist() == [0, 1]
    with pytest.raises(ValueError, match="the tokenizer has no eos token"):
        resolve_special_tokens(tokenizer)


def test_tokenizer_from_bytes_names_the_source():
    with pytest.raises(ValueError, match=r"--tokenizer gs://b/tok\.json: not a valid HF tokenizers tokenizer\.json"):
        tokenizer_from_bytes(b"{not json", "gs://b/tok.json")


# -- byte-level token lengths ------------------------------------------------------------
TEXTS = ["Hello world. This is it.", "\u00c9lan \u250c\u2500 \u4f60\u597d \U0001f600!", "  tabs\tand\n\nnewlines ",
         "spells <|endoftext|> and <extra_id_0> as text"]


@pytest.mark.parametrize("make", [project_tokenizer, gpt2_like_tokenizer])
def test_byte_level_lengths_spell_every_text_exactly(make):
    tokenizer = make()
    tokenizer.add_tokens(["h\u00e9llo wor"])  # a plain added token, matched in raw text
    tokenizer.encode_special_tokens = True  # as the pipeline encodes
    lengths = byte_level_lengths(tokenizer)
    assert lengths is not None and (lengths >= 1).all()
    for text in TEXTS + ["say h\u00e9llo world"]:
        encoding = tokenizer.encode(text, add_special_tokens=False)
        spans = np.cumsum(lengths[encoding.ids])
        encoded = text.encode("utf-8")
        assert spans[-1] == len(encoded)
        pieces = np.split(np.frombuffer(encoded, np.uint8), spans[:-1])
        assert [bytes(p) for p in pieces] == [_token_bytes(tokenizer, i) for i in encoding.ids]


def _token_bytes(tokenizer, index):
    """A token's bytes through the byte-level alphabet (added tokens: their content)."""
    added = tokenizer.get_added_tokens_decoder().get(index)
    if added is not None:
        return added.content.encode("utf-8")
    alphabet = {c: b for b, c in enumerate(_gpt2_byte_chars())}
    return bytes(alphabet[c] for c in tokenizer.id_to_token(index))


def _gpt2_byte_chars():
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    order, extra = [], 0
    for byte in range(256):
        if byte in printable:
            order.append(chr(byte))
        else:
            order.append(chr(256 + extra))
            extra += 1
    return order


def _with(tokenizer, **parts):
    for name, value in parts.items():
        setattr(tokenizer, name, value)
    return tokenizer


@pytest.mark.parametrize("variant", [
    lambda: _with(gpt2_like_tokenizer(), normalizer=normalizers.NFKC()),
    lambda: _with(gpt2_like_tokenizer(), pre_tokenizer=pre_tokenizers.ByteLevel(add_prefix_space=True)),
    lambda: _with(gpt2_like_tokenizer(), pre_tokenizer=pre_tokenizers.Whitespace()),
    lambda: _with(gpt2_like_tokenizer(), pre_tokenizer=pre_tokenizers.Sequence(
        [pre_tokenizers.Split(" ", behavior="removed"), pre_tokenizers.ByteLevel(add_prefix_space=False)])),
    lambda: Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]")),
    lambda: Tokenizer(models.Unigram([("<unk>", 0.0), ("a", -1.0)], 0)),
])
def test_byte_level_lengths_refuse_tokenizers_that_do_not_spell_bytes(variant):
    assert byte_level_lengths(variant()) is None


def test_byte_level_lengths_accept_splits_that_keep_text_and_refuse_stripping_added_tokens():
    split_first = _with(gpt2_like_tokenizer(), pre_tokenizer=pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]))
    assert byte_level_lengths(split_first) is not None
    stripping = gpt2_like_tokenizer()
    stripping.add_tokens([AddedToken("<sep>", lstrip=True)])
    assert byte_level_lengths(stripping) is None


def test_everything_missing_is_reported_in_one_message():
    """A GPT-2 style tokenizer for mlm lacks pad and mask: one run names both (and any sentinel
    or mode token shortfall), not one per attempt."""
    with pytest.raises(ValueError) as info:
        resolve_special_tokens(gpt2_like_tokenizer(), required={"eos", "pad", "mask"}, num_sentinels=3,
                               mode_tokens=("[R]",), overrides={"bos": "<nope>"})
    assert str(info.value) == (
        "the tokenizer is short of special tokens: no pad token (tried <pad>, [PAD], <|pad|>, <|padding|>); "
        "--special-token bos=<nope>: token not in the tokenizer vocabulary; no mask token (tried <mask>, [MASK], "
        "<|mask|>); 3 sentinels <extra_id_0..2> are needed, it has 0; "
        "tokens ['[R]'] the objective needs as single ids are missing "
        "(pass --special-token ROLE=TOKEN for pad, mask, or --add-special-tokens to add what is missing)")
    resolved = resolve_special_tokens(gpt2_like_tokenizer(), required={"eos", "pad", "mask"}, num_sentinels=3,
                                      mode_tokens=("[R]",), overrides={"bos": "<nope>"}, add_missing=True)
    assert resolved.added == ["<pad>", "<nope>", "<mask>", "<extra_id_0>", "<extra_id_1>", "<extra_id_2>", "[R]"]
