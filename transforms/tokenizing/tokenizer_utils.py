"""Loading a HF ``tokenizers`` tokenizer.json and resolving the special tokens the
objectives need (pad, eos, bos, unk, mask, cls, sep, ``<extra_id_k>`` sentinels, UL2 mode
tokens).

Roles are resolved from explicit ``role=TOKEN`` overrides first, then from well-known
names (``</s>``, ``<|endoftext|>``, ``[SEP]``, ...). A role an objective needs but the
tokenizer lacks is a configuration error, unless the caller asks to add the missing
tokens, in which case they are added as special tokens and the amended tokenizer is the
one written next to the dataset.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass

import numpy as np
from tokenizers import AddedToken, Tokenizer

from schemas.errors import ConfigError
from transforms.objectives.common import SpecialIds

__all__ = [
    "DEFAULT_NAMES",
    "ROLE_CANDIDATES",
    "ResolvedTokenizer",
    "byte_level_lengths",
    "sentinel_token",
    "tokenizer_from_bytes",
    "resolve_special_tokens",
]

#: Names tried, in order, for each role when no override is given.
ROLE_CANDIDATES: dict[str, tuple[str, ...]] = {
    "pad": ("<pad>", "[PAD]", "<|pad|>", "<|padding|>"),
    "eos": ("</s>", "<|endoftext|>", "<eos>", "<|eos|>", "[SEP]", "[EOS]"),
    "bos": ("<s>", "<|startoftext|>", "<bos>", "<|bos|>", "[CLS]", "[BOS]"),
    "unk": ("<unk>", "[UNK]", "<|unk|>"),
    "mask": ("<mask>", "[MASK]", "<|mask|>"),
    "cls": ("[CLS]", "<cls>", "<s>"),
    "sep": ("[SEP]", "<sep>", "</s>"),
}
#: Token added for a role when the caller allows adding missing tokens.
DEFAULT_NAMES = {
    "pad": "<pad>", "eos": "</s>", "bos": "<s>", "unk": "<unk>", "mask": "<mask>", "cls": "<s>", "sep": "</s>"
}

_SENTINEL_RE = re.compile(r"^<extra_id_(\d+)>$")


def sentinel_token(index: int) -> str:
    """The T5 name of sentinel ``index``: ``<extra_id_{index}>``."""
    return f"<extra_id_{index}>"


def tokenizer_from_bytes(data: bytes, source: str = "tokenizer.json") -> Tokenizer:
    """Parse tokenizer.json bytes, with an error that names the file."""
    try:
        return Tokenizer.from_str(data.decode("utf-8"))
    except Exception as exc:  # tokenizers raises plain Exception subclasses
        raise ConfigError(f"--tokenizer {source}: not a valid HF tokenizers tokenizer.json ({exc})") from exc


def _byte_alphabet() -> frozenset[str]:
    """The 256 characters byte-level BPE spells bytes with (GPT-2's byte-to-unicode table)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1),
                 *range(ord("\u00ae"), ord("\u00ff") + 1)]
    shifted = [256 + n for n in range(256 - len(printable))]
    return frozenset(chr(c) for c in printable + shifted)


#: Pre-tokenizers that split text without dropping or adding characters.
_LOSSLESS_SPLITS = {"Split", "Digits", "Punctuation"}


def _splits_losslessly(pre_tokenizer: dict | None) -> bool:
    if pre_tokenizer is None:
        return False
    kind = pre_tokenizer.get("type")
    if kind == "ByteLevel":
        return not pre_tokenizer.get("add_prefix_space", False)
    if kind == "Sequence":
        parts = pre_tokenizer.get("pretokenizers", [])
        byte_level = [p for p in parts if p.get("type") == "ByteLevel"]
        others_keep_text = all(p.get("type") in _LOSSLESS_SPLITS and p.get("behavior") != "Removed"
                                for p in parts if p.get("type") != "ByteLevel")
        return bool(byte_level) and others_keep_text and all(_splits_losslessly(p) for p in byte_level)
    return False


def byte_level_lengths(tokenizer: Tokenizer) -> np.ndarray | None:
    """UTF-8 byte length of every token id, when the tokenizer is a lossless byte-level BPE.

    Lossless means: no normalizer, a ByteLevel pre-tokenizer that adds no prefix space
    (alone or after splits that drop nothing), a BPE model whose every token is spelled
    in the byte alphabet (one character per byte), and added tokens that do not swallow
    the whitespace around them. Its tokens then spell the text's bytes in order, so the
    tokens' byte spans follow from the ids alone (:func:`numpy.cumsum` of these lengths)
    and the encoder's character offsets are not needed. Otherwise None.

    Callers check a document's lengths add up to its UTF-8 size before relying on them.
    """
    config = json.loads(tokenizer.to_str())
    model = config.get("model") or {}
    if config.get("normalizer") is not None or not _splits_losslessly(config.get("pre_tokenizer")):
        return None
    if model.get("type") != "BPE" or model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        return None
    alphabet = _byte_alphabet()
    lengths = np.full(tokenizer.get_vocab_size(with_added_tokens=True), -1, dtype=np.int64)
    for token, index in model.get("vocab", {}).items():
        if not set(token) <= alphabet:
            return None
        if index < len(lengths):
            lengths[index] = len(token)
    for index, added in tokenizer.get_added_tokens_decoder().items():
        if added.lstrip or added.rstrip:
            return None
        lengths[index] = len(added.content.encode("utf-8"))
    return lengths


@dataclass
class ResolvedTokenizer:
    """A tokenizer with its special ids resolved.

    Attributes:
        tokenizer: the (possibly amended) tokenizer.
        special: the resolved ids.
        roles: role -> token string, for the manifest.
        added: tokens this resolution added to the tokenizer.
    """

    tokenizer: Tokenizer
    special: SpecialIds
    roles: dict[str, str]
    added: list[str]

    def to_json_bytes(self) -> bytes:
        """The amended tokenizer.json, canonical bytes."""
        return self.tokenizer.to_str().encode("utf-8")

    def sha256(self) -> str:
        return hashlib.sha256(self.to_json_bytes()).hexdigest()


def resolve_special_tokens(
    tokenizer: Tokenizer,
    *,
    required: set[str] | frozenset[str] = frozenset({"eos"}),
    overrides: dict[str, str] | None = None,
    num_sentinels: int = 0,
    mode_tokens: tuple[str, ...] = (),
    add_missing: bool = False,
) -> ResolvedTokenizer:
    """Resolve special-token roles and make sure the sentinels and the objective's own tokens exist.

    Args:
        tokenizer: the loaded tokenizer (amended in place when tokens are added).
        required: roles the objective cannot work without.
        overrides: role -> token string given by the user (``--special-token eos=</s>``).
        num_sentinels: how many ``<extra_id_k>`` the objective may use.
        mode_tokens: the objective's own tokens that must be single ids
            (``Objective.token_needs().tokens``: UL2's ``[R]``, a plugin's; the name is the
            manifest's key, UL2's word for them).
        add_missing: add missing roles, sentinels and own tokens instead of failing.

    Raises:
        ConfigError: an override names a token the vocabulary lacks, or a required role,
            sentinel or own token is missing and ``add_missing`` is false.
    """
    overrides = dict(overrides or {})
    unknown_roles = set(overrides) - set(ROLE_CANDIDATES)
    if unknown_roles:
        raise ConfigError(
            f"--special-token: unknown role(s) {sorted(unknown_roles)}; roles are {sorted(ROLE_CANDIDATES)}"
        )
    added: list[str] = []
    roles: dict[str, str] = {}
    problems: list[str] = []  # everything missing, so that one message names it all
    missing_roles: list[str] = []

    def add(token: str) -> None:
        tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False)])
        added.append(token)

    for role, candidates in ROLE_CANDIDATES.items():
        if role in overrides:
            token = overrides[role]
            if tokenizer.token_to_id(token) is None:
                if not add_missing:
                    problems.append(f"--special-token {role}={token}: token not in the tokenizer vocabulary")
                    continue
                add(token)
            roles[role] = token
            continue
        found = next((c for c in candidates if tokenizer.token_to_id(c) is not None), None)
        if found is None and role in required:
            if not add_missing:
                problems.append(f"no {role} token (tried {', '.join(candidates)})")
                missing_roles.append(role)
                continue
            found = DEFAULT_NAMES[role]
            if tokenizer.token_to_id(found) is None:
                add(found)
        if found is not None:
            roles[role] = found

    missing_sentinels = [
        sentinel_token(k) for k in range(num_sentinels) if tokenizer.token_to_id(sentinel_token(k)) is None
    ]
    missing_modes = [t for t in mode_tokens if tokenizer.token_to_id(t) is None]
    if (missing_sentinels or missing_modes) and not add_missing:
        have = num_sentinels - len(missing_sentinels)
        if missing_sentinels:
            problems.append(f"{num_sentinels} sentinels <extra_id_0..{num_sentinels - 1}> are needed, it has {have}")
        if missing_modes:
            problems.append(f"tokens {missing_modes} the objective needs as single ids are missing")
    if len(problems) == 1 and missing_roles:
        role = missing_roles[0]
        raise ConfigError(f"the tokenizer has {problems[0]}; pass --special-token {role}=TOKEN or "
                          f"--add-special-tokens to add {DEFAULT_NAMES[role]}")
    if len(problems) == 1 and problems[0].startswith("--special-token"):
        raise ConfigError(f"{problems[0]} (pass --add-special-tokens to add it)")
    if problems:
        roles_fix = f"--special-token ROLE=TOKEN for {', '.join(missing_roles)}, or " if missing_roles else ""
        raise ConfigError(f"the tokenizer is short of special tokens: {'; '.join(problems)} "
                          f"(pass {roles_fix}--add-special-tokens to add what is missing)")
    for token in missing_sentinels + missing_modes:
        add(token)

    ids = {role: tokenizer.token_to_id(tok) for role, tok in roles.items()}
    if ids.get("pad") is None and "eos" in ids:
        ids["pad"] = ids["eos"]
        roles["pad"] = roles["eos"]
    all_special = {tokenizer.token_to_id(t.content) for t in tokenizer.get_added_tokens_decoder().values() if t.special}
    all_special.discard(None)
    special = SpecialIds(
        vocab_size=tokenizer.get_vocab_size(with_added_tokens=True),
        pad=ids.get("pad", -1) if ids.get("pad") is not None else -1,
        eos=ids.get("eos", -1) if ids.get("eos") is not None else -1,
        bos=ids.get("bos"),
        unk=ids.get("unk"),
        mask=ids.get("mask"),
        cls=ids.get("cls"),
        sep=ids.get("sep"),
        sentinels=tuple(tokenizer.token_to_id(sentinel_token(k)) for k in range(num_sentinels)),
        mode_tokens={t: tokenizer.token_to_id(t) for t in mode_tokens},
        all_special=frozenset(int(i) for i in all_special),
    )
    return ResolvedTokenizer(tokenizer=tokenizer, special=special, roles=roles, added=added)

