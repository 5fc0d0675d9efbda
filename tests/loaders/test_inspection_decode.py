"""Decoding for ``show`` and the report: whole characters from byte-level runs
(:mod:`loaders.inspection.decode`), BART's noise recovered from a stored example
(:mod:`loaders.inspection.bart_noise`), and the text layout (wrapping, real line breaks,
the legend) of :mod:`loaders.inspection.render`. Real tokenizer: the bundled byte-level BPE."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from lmshards_testing import TOKENIZER
from tokenizers import Tokenizer

from loaders.inspection.anatomy import ObjectiveView, take_apart
from loaders.inspection.decode import RunDecoder, byte_level_alphabet
from loaders.inspection.render import legend_text, render_example, to_text
from loaders.inspection.segments import RenderedExample, Segment
from loaders.inspection.source import Located
from transforms.objectives.bart import Bart, BartConfig, sentence_permutation
from transforms.objectives.bart_noise import recover_bart_noise
from transforms.objectives.base import build_example
from transforms.objectives.common import SpecialIds
from transforms.objectives.layout import example_randoms
from transforms.objectives.registry import make_objective
from transforms.tokenizing.tokenize import TokenFeatures

TOK = Tokenizer.from_file(TOKENIZER)
DECODER = RunDecoder(TOK)
SPECIAL = SpecialIds(vocab_size=TOK.get_vocab_size(), pad=0, eos=1, bos=2, unk=3, mask=4,
                     sentinels=tuple(TOK.token_to_id(f"<extra_id_{k}>") for k in range(100)),
                     all_special=frozenset(int(i) for i in TOK.get_added_tokens_decoder()))
SENTINEL = TOK.token_to_id("<extra_id_0>")
TEXTS = [
    "Ünïcödé: naïve café, 東京タワー and emoji 😀🎉 — “quotes”. Second sentence here!",
    "Ελληνικά κείμενα. Русский текст тоже здесь.\n\nالعربية أيضا. 한국어 문장도.",
]
CHUNK_TEXT = ("The first sentence is here. Then a second one follows! Does a third ask?\n\n"
              "A new paragraph starts. It has “quotes” and café au lait. Numbers 1, 2 and 3 end it.") * 3


def test_the_byte_level_alphabet_is_a_bijection_onto_bytes():
    alphabet = byte_level_alphabet()
    assert sorted(alphabet.values()) == list(range(256))
    assert alphabet["Ġ"] == ord(" ") and alphabet["Ċ"] == ord("\n") and alphabet["A"] == ord("A")


@given(st.sampled_from(TEXTS), st.lists(st.integers(0, 400), max_size=12), st.lists(st.booleans(), max_size=13))
def test_runs_of_one_sequence_decode_to_whole_characters(text, cuts, marked):
    ids = TOK.encode(text, add_special_tokens=False).ids
    bounds = sorted({0, len(ids), *(c % (len(ids) + 1) for c in cuts)})
    runs = [ids[a:b] for a, b in zip(bounds, bounds[1:])]
    flags = (marked + [False] * len(runs))[: len(runs)]
    texts = DECODER.texts(runs, flags)
    assert "".join(texts) == text == TOK.decode(ids)  # every character once, in order, none broken


def test_a_character_split_between_runs_goes_to_the_marked_run_and_fragments_show_as_bytes():
    ids = TOK.encode("東京", add_special_tokens=False).ids
    cut = next(i for i in range(1, len(ids)) if TOK.decode(ids[:i]).endswith("\ufffd"))  # inside a character
    whole = TOK.decode(ids[:cut]).rstrip("\ufffd")  # the characters complete before the cut
    split = "東京"[len(whole)]
    assert DECODER.texts([ids[:cut], ids[cut:]], [False, True]) == [whole, "東京"[len(whole):]]
    assert DECODER.texts([ids[:cut], ids[cut:]], [True, False]) == [whole + split, "東京"[len(whole) + 1:]]
    # a sentinel between the bytes of one character: the sequence holds parts of it, shown as \xNN
    texts = DECODER.texts([ids[:cut], [SENTINEL], ids[cut:]])
    head = split.encode("utf-8")[: len(b"".join(DECODER.token_bytes(t) for t in ids[:cut])) - len(whole.encode())]
    assert texts[0] == whole + "".join(f"\\x{b:02x}" for b in head) and texts[1] == "<extra_id_0>"
    assert "\ufffd" not in "".join(texts) and texts[2].startswith("\\x")


def test_a_tokenizer_without_a_byte_level_decoder_decodes_each_run():
    class Plain:
        def decode(self, ids, skip_special_tokens=False):
            return "".join(f"<{i}>" for i in ids)

    assert RunDecoder(Plain()).texts([[1, 2], [], [3]]) == ["<1><2>", "", "<3>"]


def _bart_example(text: str, key: str, config: BartConfig):
    ids = np.array(TOK.encode(text, add_special_tokens=False).ids[: config.raw_length - 1] + [SPECIAL.eos], np.int32)
    document = TOK.decode(ids[:-1].tolist())
    flags = TokenFeatures(Tokenizer.from_file(TOKENIZER), {"sentence_starts"}).of(
        document, ids[:-1])["sentence_starts"]
    flags = np.append(flags, False)  # EOS
    example, _ = build_example(Bart(config), ids, SPECIAL, example_randoms(0, [key]),
                               features={"sentence_starts": flags})
    return ids, flags, example


@pytest.mark.parametrize("key", [f"train-b00001-c{c:06d}-d0" for c in range(12)])
def test_bart_noise_is_recovered_exactly(key):
    """The sentence starts recomputed from the targets equal the pipeline's; the replayed
    permutation and the alignment explain the inputs token for token."""
    config = BartConfig(seq_len=80)
    chunk, flags, example = _bart_example(CHUNK_TEXT, key, config)
    assert any(np.array_equal(flags, c) for c in DECODER.sentence_starts(chunk, SPECIAL.eos))
    noise = recover_bart_noise(example["inputs"], example["targets"], key, 0, config, SPECIAL, DECODER)
    assert noise is not None
    index = sentence_permutation(chunk.size, flags, 1.0, example_randoms(0, [key]))
    assert noise.permuted[1:-1].tolist() == (index + 1).tolist()
    assert noise.sentences == int(flags.sum())
    inputs, targets = example["inputs"], example["targets"]
    rebuilt = []
    for edit in noise.edits:
        (i0, i1), (p0, p1) = edit.inputs, edit.source
        source = targets[noise.permuted[p0:p1]]
        if edit.kind == "keep":
            assert inputs[i0:i1].tolist() == source.tolist()
        elif edit.kind == "mask":
            assert (inputs[i0:i1] == SPECIAL.mask).all()
        rebuilt += inputs[i0:i1].tolist()
    assert rebuilt == inputs.tolist()
    masks = sum(1 for e in noise.edits if e.kind == "mask")
    assert masks >= 1


def test_bart_noise_with_rotation_is_not_guessed():
    config = BartConfig(seq_len=80, rotate=1.0)
    _, _, example = _bart_example(CHUNK_TEXT, "train-b00001-c000001-d0", config)
    assert recover_bart_noise(example["inputs"], example["targets"], "train-b00001-c000001-d0", 0, config, SPECIAL,
                              DECODER) is None


def test_bart_example_renders_masks_with_what_they_hide_and_the_sentence_order():
    key = "train-b00001-c000003-d0"
    config = BartConfig(seq_len=80)
    _, _, example = _bart_example(CHUNK_TEXT, key, config)
    example = {"key": key, "inputs": example["inputs"], "targets": example["targets"]}
    view = ObjectiveView(make_objective("bart", {"seq_len": 80}), SPECIAL)
    rendered = render_example(Located("train", 0, 0, example), take_apart(example, view), view, seed=0,
                              decoder=DECODER)
    names = [name for name, _ in rendered.lines]
    text = to_text(rendered, DECODER)
    assert names == ["inputs", "targets", "restored"] and "sentences=" in rendered.header
    restored = text[text.index("restored: ") + 10:]
    targets = text[text.index("targets: ") + 9:text.index("restored: ")]
    hidden = re.findall(r"\[MASK(?:\*\d+)?:([^\]]*)\]", restored)
    assert hidden and all(h.replace("\u21b5\n", "\n").strip(" ") for h in hidden)
    assert "[#1]" in text and "<mask>" not in restored.replace("[RAND:", "")  # every <mask> explained
    # without its markup the restored line is the targets' text with the sentences in input order
    noise = recover_bart_noise(example["inputs"], example["targets"], key, 0, config, SPECIAL, DECODER)
    plain = re.sub(r"\[#\d+\]|\[\+MASK(?:\*\d+)?\]|\[\+RAND:[^\]]*\]|\[RAND:.*?->|\[MASK(?:\*\d+)?:|\[DEL:", "",
                   restored.rstrip("\n"))
    assert "]" not in CHUNK_TEXT and targets
    plain = plain.replace("]", "").replace("\u21b5\n" + " " * 10, "\n")  # continuation lines are indented
    assert plain == DECODER.text(example["targets"][noise.permuted])


def test_text_wraps_at_the_width_keeps_line_breaks_and_balances_colours():
    ids = TOK.encode("word " * 40 + "\nnext line\n\nlast", add_special_tokens=False).ids
    view = ObjectiveView(make_objective("clm", {"seq_len": len(ids)}), SPECIAL)
    example = {"key": "train-x-c1-d0", "input_ids": np.array(ids, np.int32), "doc_lengths": np.array([len(ids)])}
    rendered = render_example(Located("train", 0, 0, example), take_apart(example, view), view)
    plain = to_text(rendered, DECODER, width=50).splitlines()
    assert all(len(line) <= 50 for line in plain)
    body = plain[next(n for n, line in enumerate(plain) if line.startswith("input_ids: ")):]
    assert body[0].startswith("input_ids: word") and all(line.startswith(" " * 11) for line in body[1:])
    assert any(line.endswith("\u21b5") for line in body) and "\\n" not in "\n".join(plain)
    joined = "".join(line[11:] for line in body)
    assert joined.replace("\u21b5", "\n").replace(" ", "") == TOK.decode(ids).replace(" ", "")
    colour = to_text(rendered, DECODER, width=50, color=True)
    assert colour.count("\x1b[0m") == len(re.findall(r"\x1b\[[0-9;]+m", colour)) - colour.count("\x1b[0m")
    unwrapped = to_text(rendered, DECODER)
    assert max(len(line) for line in unwrapped.splitlines()) > 100  # width None: only the real breaks


def test_legend_lists_the_markup_the_examples_use():
    view = ObjectiveView(make_objective("mlm", {"seq_len": 16}), SPECIAL)
    chunk = np.array(TOK.encode("a b c d e f g h i j k l m n o p", add_special_tokens=False).ids[:16], np.int32)
    key = "train-b00001-c000001-d0"
    built, _ = build_example(make_objective("mlm", {"seq_len": 16}), chunk, SPECIAL, example_randoms(0, [key]))
    example = {"key": key, "input_ids": built["input_ids"], "labels": built["labels"]}
    rendered = render_example(Located("train", 0, 0, example), take_apart(example, view), view)
    legend = legend_text([rendered])
    assert legend.startswith("markup:\n") and "[MASK:orig]" in legend and "\u21b5" in legend
    assert "<extra_id_k>" not in legend and "[/doc]" not in legend


def test_the_legend_explains_every_star_n_the_text_shows():
    """A run of N masks prints ``[MASK*N:orig]`` (N inserted ones ``[+MASK*N]``, padding
    ``<pad>*N``): each such markup the text uses has a legend line saying what N counts."""
    mask, pad = SPECIAL.mask, SPECIAL.pad
    hidden = TOK.encode(" three hidden words", add_special_tokens=False).ids
    rendered = RenderedExample("── example", [
        ("inputs", [Segment("text", TOK.encode("Some", add_special_tokens=False).ids),
                    Segment("mask", [mask] * len(hidden), original=hidden),
                    Segment("insert", [mask, mask]), Segment("pad", [pad] * 5)])])
    text, legend = to_text(rendered, DECODER), legend_text([rendered])
    stars = set(re.findall(r"(\[MASK\*|\[\+MASK\*|<pad>\*)\d+", text))
    assert stars == {"[MASK*", "[+MASK*", "<pad>*"}, text
    assert f"[MASK*{len(hidden)}: three hidden words]" in text and "[+MASK*2]" in text and "<pad>*5" in text
    lines = legend.splitlines()
    for sample, meaning in (("[MASK*N:orig]", "N <mask> tokens in a row"), ("[+MASK*N]", "N <mask> tokens inserted"),
                            ("<pad>*N", "N padding tokens")):
        assert any(line.split()[0] == sample and meaning in line for line in lines), legend
