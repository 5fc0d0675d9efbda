"""Token runs decoded to whole characters, for ``lmshards show`` and the report.

An example is shown as runs of tokens (plain text, a masked token, a noise span, ...). A
byte-level BPE (GPT-2 style: the ``ByteLevel`` decoder) spells text in UTF-8 *bytes*, so one
character can be split over two tokens; decoding each run alone then shows the halves as
U+FFFD. :class:`RunDecoder` decodes the runs of one sequence together instead:

- the tokens' bytes are laid end to end (an added token such as ``<extra_id_0>`` or
  ``<mask>`` stands for itself and interrupts the bytes, as in ``Tokenizer.decode``);
- every character goes to one run: the run holding its bytes, or for a character split
  between runs the first *marked* run among them (a mask, a span: what the reader looks
  for), else the first;
- bytes that form no character (a character the sequence really holds only half of, next
  to a sentinel or a mask) show as ``\\xNN`` escapes, never as U+FFFD.

Joined, the runs' texts equal ``tokenizer.decode(all ids, skip_special_tokens=False)``
wherever that holds no U+FFFD. Tokenizers without a byte-level decoder (WordPiece,
SentencePiece) decode each run with ``Tokenizer.decode``; their tokens hold whole characters.

The bytes tokens spell also give a chunk's sentence starts again by the pipeline's rule
(:meth:`RunDecoder.sentence_starts`), for an objective that recovers its noise from them
(``Objective.example_lines`` gets the decoder in its context).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from transforms.tokenizing.text_rules import byte_positions, sentence_start_chars, token_flags

__all__ = ["RunDecoder", "byte_level_alphabet"]

_ESCAPED_BYTES = range(0xDC80, 0xDD00)  # surrogateescape's stand-ins for bytes that are no character


def byte_level_alphabet() -> dict[str, int]:
    """The byte-level BPE alphabet: the printable character that spells each byte.

    Bytes that are printable Latin-1 characters (``!`` to ``~``, ``¡`` to ``¬``, ``®`` to
    ``ÿ``) spell themselves; the other 68 bytes, in increasing order, are spelled by the
    code points from U+0100 on (so a space is ``Ġ``, a newline ``Ċ``).
    """
    direct = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    alphabet = {chr(b): b for b in direct}
    others = (b for b in range(256) if b not in set(direct))
    alphabet.update({chr(0x100 + n): b for n, b in enumerate(others)})
    return alphabet


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


def _is_byte_level(tokenizer: Any) -> bool:
    to_str = getattr(tokenizer, "to_str", None)
    if to_str is None:
        return False
    try:
        decoder = json.loads(to_str()).get("decoder") or {}
    except (TypeError, ValueError):
        return False
    decoders = decoder.get("decoders", []) if decoder.get("type") == "Sequence" else [decoder]
    return any(isinstance(d, dict) and d.get("type") == "ByteLevel" for d in decoders)


class RunDecoder:
    """Decodes runs of token ids of one sequence so that every character stays whole.

    Args:
        tokenizer: a HF ``tokenizers.Tokenizer`` (or anything with ``decode(ids,
            skip_special_tokens=False)``: then each run is decoded alone).
    """

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.byte_level = _is_byte_level(tokenizer)
        self._alphabet = byte_level_alphabet() if self.byte_level else {}
        self._atoms: dict[int, str] = {}
        if self.byte_level:
            self._atoms = {int(i): t.content for i, t in tokenizer.get_added_tokens_decoder().items()}
        self._bytes: dict[int, bytes | None] = {}

    def token_bytes(self, token: int) -> bytes | None:
        """The bytes a byte-level token spells (None for an added token, an unknown id, or a
        tokenizer that is not byte-level)."""
        if not self.byte_level:
            return None
        if token not in self._bytes:
            piece = None if token in self._atoms else self.tokenizer.id_to_token(token)
            spelled = None
            if piece is not None and all(c in self._alphabet for c in piece):
                spelled = bytes(self._alphabet[c] for c in piece)
            self._bytes[token] = spelled
        return self._bytes[token]

    def sentence_starts(self, chunk: np.ndarray, eos: int) -> list[np.ndarray] | None:
        """Candidate sentence-start flags of a chunk of token ids, recomputed from its text with
        the pipeline's rule (:mod:`transforms.tokenizing.text_rules`) per document (``eos`` ends
        one); None when its tokens do not spell bytes (not byte-level, an added token). Two
        candidates differ only in the chunk's first document: whether its first non-space
        character starts a sentence (it does when the chunk starts the document; the shards do
        not say)."""
        spelled = [None if int(t) == eos else self.token_bytes(int(t)) for t in chunk]
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

    def text(self, ids: Sequence[int]) -> str:
        """One run alone (a random replacement token, padding)."""
        return self.texts([ids])[0]

    def texts(self, runs: Sequence[Sequence[int]], marked: Sequence[bool] | None = None) -> list[str]:
        """The text of each run of one sequence (see the module docstring).

        Args:
            runs: consecutive runs of token ids.
            marked: per run, whether a character split with a neighbour should go to it.
        """
        runs = [[int(t) for t in run] for run in runs]
        if not self.byte_level:
            return [self.tokenizer.decode(run, skip_special_tokens=False) if run else "" for run in runs]
        marked = list(marked) if marked is not None else [False] * len(runs)
        pieces: list[list[str]] = [[] for _ in runs]
        pending: list[tuple[int, bytes]] = []  # (run, bytes) since the last added token

        def flush() -> None:
            if not pending:
                return
            owner = [run for run, data in pending for _ in range(len(data))]
            text = b"".join(data for _, data in pending).decode("utf-8", "surrogateescape")
            position = 0
            for char in text:
                if ord(char) in _ESCAPED_BYTES:
                    pieces[owner[position]].append(f"\\x{ord(char) - 0xDC00:02x}")
                    position += 1
                    continue
                size = len(char.encode("utf-8"))
                touched = owner[position : position + size]
                target = next((run for run in touched if marked[run]), touched[0])
                pieces[target].append(char)
                position += size
            pending.clear()

        for index, run in enumerate(runs):
            for token in run:
                spelled = self.token_bytes(token)
                if spelled is None:
                    flush()
                    atom = self._atoms.get(token)
                    pieces[index].append(atom if atom is not None else
                                         self.tokenizer.decode([token], skip_special_tokens=False))
                else:
                    pending.append((index, spelled))
        flush()
        return ["".join(p) for p in pieces]
