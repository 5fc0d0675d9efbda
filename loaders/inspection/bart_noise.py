"""BART's noise recovered from a stored example: where each sentence moved, what each
``<mask>`` hides.

The shards keep ``inputs`` and ``targets`` only (:mod:`transforms.objectives.bart`):
``targets`` is ``<s> chunk </s>``; ``inputs`` is the chunk with its sentences permuted, then
noised. Both steps are recovered without the word starts the pipeline had:

1. Sentence permutation is the first draw of the example's generator
   (:func:`transforms.objectives.bart.sentence_permutation`, seeded by ``(seed, example
   key)``). The chunk's sentence starts are recomputed from the text the targets spell, with
   the pipeline's own rule (:mod:`transforms.text_rules`), per document of the chunk (EOS
   ends one); the draw is then replayed.
2. ``inputs`` is a monotonic edit of the permuted chunk: a masked span becomes one
   ``<mask>`` (or a random token), a zero-length span inserts a ``<mask>``; the optional
   passes mask every token of a word, delete words or insert random tokens. Aligning the two
   (:class:`difflib.SequenceMatcher`) recovers every edit.

A recovery is accepted only when every edit is one these steps can make: a wrong replay
(a chunk that starts inside a blank line, say) leaves text out of place, which no such
edit explains. Document rotation, a tokenizer that is not byte-level, or an example that is
not framed gives None, and the example is shown without the recovery.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

import numpy as np

from loaders.inspection.decode import RunDecoder
from transforms.objectives.bart import BartConfig, sentence_permutation
from transforms.objectives.common import SpecialIds, example_rng
from transforms.text_rules import byte_positions, sentence_start_chars, token_flags

__all__ = ["BartNoise", "Edit", "chunk_sentence_starts", "recover_bart_noise"]

#: Longest run of inputs tokens with a random one among them that one edit may explain
#: (neighbouring spans); sentences left out of place by a wrong replay leave longer runs.
_MAX_RANDOM_RUN = 3


@dataclass(frozen=True)
class Edit:
    """One step of the alignment of ``inputs`` with the permuted targets.

    Attributes:
        kind: ``keep`` (copied), ``mask`` (masks hiding the source run; an empty run: inserted
            masks), ``random`` (random tokens, maybe beside a ``<mask>``, in place of the
            source run of neighbouring spans, or inserted) or ``delete`` (the source run removed).
        inputs: ``(start, stop)`` in ``inputs``.
        source: ``(start, stop)`` in the permuted targets (:attr:`BartNoise.permuted`).
    """

    kind: str
    inputs: tuple[int, int]
    source: tuple[int, int]


@dataclass
class BartNoise:
    """What the noise did to one example.

    Attributes:
        permuted: per position of the permuted framed sequence, the targets position it holds.
        sentence_of: per targets position, the index of its sentence (0 for ``<s>``, the last
            for ``</s>``).
        sentences: sentences in the chunk.
        order: the sentences in the order the inputs hold them.
        edits: the alignment, in order, covering ``inputs`` and ``permuted``.
    """

    permuted: np.ndarray
    sentence_of: np.ndarray
    sentences: int
    order: list[int]
    edits: list[Edit]


def _utf8_window(data: bytes) -> tuple[int, int]:
    """The largest ``[start, stop)`` of ``data`` that holds whole characters: a chunk may cut a
    character at either end."""
    start = 0
    while start < min(len(data), 3) and 0x80 <= data[start] < 0xC0:
        start += 1
    stop = len(data)
    for back in range(1, min(4, stop - start) + 1):
        byte = data[stop - back]
        if byte < 0x80:
            break
        if byte >= 0xC0:  # a lead byte: is its character complete?
            need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            stop = stop if back >= need else stop - back
            break
    return start, stop


def chunk_sentence_starts(chunk: np.ndarray, eos: int, decoder: RunDecoder) -> list[np.ndarray] | None:
    """Candidate sentence-start flags of a chunk, recomputed from its text (None when its tokens
    do not spell bytes). Two candidates differ only in the chunk's first document: whether
    its first non-space character starts a sentence (it does when the chunk starts the
    document; the shards do not say)."""
    spelled = [None if int(t) == eos else decoder.token_bytes(int(t)) for t in chunk]
    if any(s is None for t, s in zip(chunk, spelled) if int(t) != eos):
        return None
    candidates = []
    for first_rule in (True, False):
        flags = np.zeros(chunk.size, dtype=bool)
        start = 0
        for stop in [*np.flatnonzero(chunk == eos).tolist(), chunk.size]:
            pieces = spelled[start:stop]
            if pieces:
                data = b"".join(pieces)
                low, high = _utf8_window(data)
                try:
                    text = data[low:high].decode("utf-8")
                except UnicodeDecodeError:
                    return None
                chars = sentence_start_chars(text)
                if start == 0 and not first_rule:
                    chars = chars[chars != len(text) - len(text.lstrip())]
                positions = byte_positions(text, text.encode("utf-8"), chars) + low
                ends = np.cumsum([len(p) for p in pieces])
                flags[start:stop] = token_flags(ends, positions)
            start = stop + 1
        candidates.append(flags)
    return candidates if not np.array_equal(*candidates) else candidates[:1]


def _edits(inputs: np.ndarray, permuted_ids: np.ndarray, config: BartConfig, special: SpecialIds) -> list[Edit] | None:
    """The alignment, or None when some step is not an edit BART's noise makes."""
    matcher = difflib.SequenceMatcher(None, inputs.tolist(), permuted_ids.tolist(), autojunk=False)
    specials = set(special.special_array().tolist())
    out = []
    for tag, i0, i1, p0, p1 in matcher.get_opcodes():
        shown = inputs[i0:i1]
        if tag == "equal":
            out.append(Edit("keep", (i0, i1), (p0, p1)))
        elif i0 == i1:
            if not (config.replace_length == 0 or config.token_delete > 0) or special.bos in permuted_ids[p0:p1] \
                    or special.eos in permuted_ids[p0:p1]:
                return None
            out.append(Edit("delete", (i0, i1), (p0, p1)))
        elif (shown == special.mask).all():
            out.append(Edit("mask", (i0, i1), (p0, p1)))
        elif i1 - i0 <= _MAX_RANDOM_RUN and all(int(t) == special.mask or int(t) not in specials for t in shown):
            # neighbouring spans: one replaced by a random token, the next by a <mask> or another
            out.append(Edit("random", (i0, i1), (p0, p1)))
        else:
            return None
    return out


def recover_bart_noise(inputs: np.ndarray, targets: np.ndarray, key: str, seed: int, config: BartConfig,
                       special: SpecialIds, decoder: RunDecoder) -> BartNoise | None:
    """Recover the sentence moves and masks of one BART example (see the module docstring)."""
    inputs, targets = np.asarray(inputs), np.asarray(targets)
    if config.rotate > 0 or targets.size < 2 or inputs.size < 2 or targets[0] != special.bos \
            or targets[-1] != special.eos or inputs[0] != special.bos or inputs[-1] != special.eos:
        return None
    chunk = targets[1:-1]
    candidates = [np.zeros(chunk.size, dtype=bool)]
    if config.permute_sentences > 0:
        candidates = chunk_sentence_starts(chunk, special.eos, decoder)
        if candidates is None:
            return None
    for flags in candidates:
        index = sentence_permutation(chunk.size, flags, config.permute_sentences, example_rng(seed, key))
        interior = np.arange(chunk.size) if index is None else np.asarray(index)
        permuted = np.concatenate([[0], interior + 1, [targets.size - 1]])
        edits = _edits(inputs, targets[permuted], config, special)
        if edits is None:
            continue
        starts = flags.copy()
        if starts.size:
            starts[0] = True
        sentence_of = np.concatenate([[0], np.cumsum(starts) - 1, [max(int(starts.sum()) - 1, 0)]])
        order = list(dict.fromkeys(int(s) for s in sentence_of[permuted[1:-1]]))
        return BartNoise(permuted=permuted, sentence_of=sentence_of, sentences=int(starts.sum()), order=order,
                         edits=edits)
    return None
