"""Which encoder backend a job uses (``--encoder``), decided once when it is planned.

A dataset's bytes never depend on the backend. So ``auto`` (:func:`choose_encoder`) takes
fastokens only when it loads the tokenizer, the job needs nothing but ids from the encoder,
and the parity probe passes: the texts of :func:`transforms.tokenizing.encoder_probe.probe_texts`
(hard strings and the first documents of the corpus) encode to identical ids with both
backends. Otherwise the job uses ``tokenizers`` and says why (:class:`EncoderChoice`, the
manifest's ``run.encoder`` entry).
"""

from __future__ import annotations

import copy
import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from tokenizers import Tokenizer

from schemas.errors import ConfigError
from transforms.tokenizing.encoder import (
    ENCODER_CHOICES,
    EncoderUnavailable,
    FastokensEncoder,
    TokenizersEncoder,
    error_line,
    fastokens_version,
)
from transforms.tokenizing.encoder_probe import first_difference, probe_texts

__all__ = ["EncoderChoice", "choose_encoder"]


@dataclass
class EncoderChoice:
    """The backend a job encodes with, decided when it is planned.

    Attributes:
        requested: the ``--encoder`` value.
        backend: ``fastokens`` or ``tokenizers``.
        reason: why ``auto`` did not take fastokens (None when it did, or when asked for tokenizers).
        probe: the parity probe: ``result`` (``passed``, ``mismatch`` or ``not_run``), the number of
            ``texts`` and ``characters`` compared, and for a mismatch the ``first_difference``.
    """

    requested: str
    backend: str
    reason: str | None = None
    probe: dict[str, Any] = field(default_factory=lambda: {"result": "not_run"})

    def to_json(self) -> dict[str, Any]:
        """The manifest's ``run.encoder`` entry."""
        from importlib import metadata

        return {
            "requested": self.requested,
            "backend": self.backend,
            "fastokens_version": fastokens_version(),
            "tokenizers_version": metadata.version("tokenizers"),
            "reason": self.reason,
            "probe": dict(self.probe),
        }


def _excerpt(text: str, limit: int = 60) -> str:
    shown = text if len(text) <= limit else text[:limit] + "..."
    return repr(shown)


def _fails(encoder, text: str) -> bool:
    """Whether ``encoder`` cannot encode ``text`` (tokenizers' Rust panics included)."""
    try:
        encoder.encode([text])
    except BaseException as exc:  # pyo3's PanicException is a BaseException
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        return True
    return False


def choose_encoder(requested: str, tokenizer_json: str, *, needs_full: bool = False,
                   documents: list[str] = ()) -> EncoderChoice:
    """Decide the job's encoder backend (``--encoder``), probing fastokens against tokenizers.

    The probe's verdict is a function of the tokenizer, the documents and the installed
    backends only, so a process that plans the same tokenizer and sample again (a sweep over
    objectives, a notebook that runs a job twice) reuses it (:data:`_VERDICTS`).

    Args:
        requested: ``auto``, ``fastokens`` or ``tokenizers``.
        tokenizer_json: the tokenizer the job encodes with (added tokens included).
        needs_full: the job needs offsets or word ids from the encoder (its per-token features
            cannot be derived from the ids and the text for this tokenizer).
        documents: the corpus sample for the probe.

    Raises:
        ConfigError: ``--encoder fastokens`` where fastokens cannot be used or the probe fails
            (a configuration error), or an unknown value.
    """
    if requested not in ENCODER_CHOICES:
        raise ConfigError(f"--encoder {requested}: expected one of {', '.join(ENCODER_CHOICES)}")
    if requested == "tokenizers":
        return EncoderChoice(requested, "tokenizers")
    if needs_full:
        reason = ("this tokenizer's word or sentence starts need the offsets and word ids of tokenizers, "
                  "which fastokens does not give")
        probe = {"result": "not_run"}
    else:
        reason, probe = _verdict(tokenizer_json, list(documents))
    if reason is None:
        return EncoderChoice(requested, "fastokens", None, probe)
    if requested == "fastokens":
        raise ConfigError(f"--encoder fastokens: {reason} (use --encoder auto or tokenizers)")
    return EncoderChoice(requested, "tokenizers", reason, probe)


#: The last verdicts of :func:`_probe`, by a digest of the tokenizer and the documents.
_VERDICTS: OrderedDict[bytes, tuple[str | None, dict[str, Any]]] = OrderedDict()
_VERDICTS_KEPT = 8
_VERDICTS_LOCK = threading.Lock()  # jobs may be planned in threads of one process


def _verdict(tokenizer_json: str, documents: list[str]) -> tuple[str | None, dict[str, Any]]:
    """:func:`_probe`'s verdict, from :data:`_VERDICTS` when this tokenizer and sample were probed
    (only the verdicts that are the tokenizer's are kept)."""
    digest = hashlib.sha256()
    for text in (tokenizer_json, *documents):  # each length-prefixed: no two lists give one stream
        data = text.encode("utf-8", "surrogatepass")
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    key = digest.digest()
    with _VERDICTS_LOCK:
        if key in _VERDICTS:
            _VERDICTS.move_to_end(key)
            reason, probe = _VERDICTS[key]
            return reason, copy.deepcopy(probe)
    reason, probe, keep = _probe(tokenizer_json, documents)
    if keep:
        with _VERDICTS_LOCK:
            _VERDICTS[key] = (reason, copy.deepcopy(probe))
            while len(_VERDICTS) > _VERDICTS_KEPT:
                _VERDICTS.popitem(last=False)
    return reason, probe


def _probe(tokenizer_json: str, documents: list[str]) -> tuple[str | None, dict[str, Any], bool]:
    """``(why fastokens cannot be used or None, the probe's record, whether the verdict is the
    tokenizer's)``: fastokens loads the tokenizer and encodes the probe texts to the ids that
    tokenizers gives. Not the tokenizer's: that fastokens cannot be imported, or that it failed
    on the probe (which may be the machine's doing: out of memory)."""
    try:
        fast = FastokensEncoder(tokenizer_json)
    except EncoderUnavailable as exc:
        return str(exc), {"result": "not_run"}, "not importable" not in str(exc)
    reference_tokenizer = Tokenizer.from_str(tokenizer_json)
    added = [token.content for token in reference_tokenizer.get_added_tokens_decoder().values()]
    reference = TokenizersEncoder(reference_tokenizer)
    texts = probe_texts(added, documents)
    probe: dict[str, Any] = {"texts": len(texts), "characters": sum(map(len, texts))}
    try:
        fast_ids = fast.encode(texts)
    except Exception as exc:
        # A text that both backends refuse (a Split regex past its engine's limit) is rejected by
        # either in the run: it tells nothing about parity. One only fastokens refuses does.
        kept = [text for text in texts if not (_fails(fast, text) and _fails(reference, text))]
        try:
            if len(kept) == len(texts):
                raise
            fast_ids, texts = fast.encode(kept), kept
        except Exception:
            return f"fastokens failed on the parity probe ({error_line(exc)})", {**probe, "result": "error"}, False
    index = first_difference(reference.encode(texts), fast_ids)
    if index is not None:
        where = "corpus document" if index >= len(texts) - len(documents) else "probe text"
        probe.update(result="mismatch", first_difference=_excerpt(texts[index]))
        return f"fastokens encodes the {where} {_excerpt(texts[index])} differently from tokenizers", probe, True
    probe["result"] = "passed"
    return None, probe, True
