"""The one interface every objective implements, batch first, so that the pipeline, the loader
and the inspection tools drive any objective the same way (docs/design.md section 4).

Flow:

1. Planning (the packer): :meth:`Objective.plan` gives the raw length and an int plan of many
   chunks at once from one uniform number per chunk (``plan_uniforms`` of the chunk keys,
   :mod:`transforms.objectives.layout`). Most objectives ignore the numbers: their
   :attr:`Objective.fixed_raw_length` is set and every chunk has that length. UL2 draws its
   denoiser from the number, because the raw length depends on it.
2. Building: :meth:`Objective.build` turns a :class:`Block` of chunks (tokens end to end with
   their document lengths, optional per-token features, plans, and the rows' counter-based
   :class:`~transforms.objectives.randoms.Randoms`) into :class:`Built` columns and the summed
   integer counters of its examples, in one call. A single example is a block of one
   (:func:`build_example`); there is no other code path.

Counters are integers only (never floats), so their sums are exact in any order
(:mod:`transforms.objectives.counters`). Fixed-length columns come back padded with the pad
id to their schema length, the padding counted in ``padding_tokens``.

Everything else the rest of the code needs of an objective (flags, summary, loader facts,
inspection hooks) is declared on :class:`Objective` too, with defaults; this module is some
450 lines because it is that whole contract, in one place to read.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from transforms.objectives.common import SpecialIds
from transforms.objectives.randoms import Randoms
from transforms.objectives.shown import Shown, family_shown
from transforms.objectives.summary import common_summary

__all__ = ["Block", "Built", "InspectionContext", "Objective", "TokenNeeds", "build_example", "flat_rows",
           "in_block_order", "padded_rows"]


class Built(NamedTuple):
    """What :meth:`Objective.build` returns for a block of ``n`` rows.

    Attributes:
        arrays: array column -> ``(flat int32 values, int64 offsets of length n + 1)``.
        scalars: scalar column -> ``n`` int32 values.
        strings: string column (other than ``key``) -> ``n`` strings.
        counters: the summed integer counters of the block's examples.
    """

    arrays: dict[str, tuple[np.ndarray, np.ndarray]]
    scalars: dict[str, np.ndarray]
    strings: dict[str, list[str]]
    counters: dict[str, int]


class Block:
    """Chunks an objective builds at once.

    Attributes:
        tokens: every row's tokens end to end (int32).
        offsets: ``n + 1`` int64 offsets of the rows in ``tokens``.
        doc_lengths: the rows' document segment lengths end to end (int32; they add up to each
            row's length).
        doc_offsets: ``n + 1`` int64 offsets of the rows in ``doc_lengths``.
        features: feature name -> bool per token, aligned with ``tokens``.
        plans: ``n`` int64 plans (UL2's denoiser index; 0 for other objectives).
        randoms: the rows' counter-based random numbers.
    """

    __slots__ = ("tokens", "offsets", "doc_lengths", "doc_offsets", "features", "plans", "randoms")

    def __init__(self, tokens: np.ndarray, offsets: np.ndarray, doc_lengths: np.ndarray, doc_offsets: np.ndarray,
                 features: dict[str, np.ndarray], plans: np.ndarray, randoms: Randoms):
        self.tokens, self.offsets = tokens, offsets
        self.doc_lengths, self.doc_offsets = doc_lengths, doc_offsets
        self.features, self.plans, self.randoms = features, plans, randoms
        if len(randoms) != self.count or plans.shape[0] != self.count or doc_offsets.shape[0] != self.count + 1:
            raise ValueError(f"a block of {self.count} rows needs {self.count} plans, randoms and document "
                             f"offsets, got {plans.shape[0]}, {len(randoms)} and {doc_offsets.shape[0] - 1}")

    @classmethod
    def of_rows(cls, rows: Sequence[Any], plans: Sequence[int], randoms: Randoms) -> Block:
        """A block of rows that each have ``tokens``, ``doc_lengths`` and ``features`` (a
        :class:`~transforms.objectives.packing.Piece`); every row has the same feature names.

        Raises:
            ValueError: rows with different feature names.
        """
        count = len(rows)
        lengths = np.fromiter((row.tokens.shape[0] for row in rows), dtype=np.int64, count=count)
        segments = np.fromiter((row.doc_lengths.shape[0] for row in rows), dtype=np.int64, count=count)
        names = sorted(rows[0].features) if rows else []
        if any(sorted(row.features) != names for row in rows):
            raise ValueError(f"every chunk of a block needs the features {names}")
        empty = np.zeros(0, np.int32)
        return cls(
            np.concatenate([row.tokens for row in rows]).astype(np.int32, copy=False) if count else empty,
            _offsets(lengths),
            np.concatenate([row.doc_lengths for row in rows]).astype(np.int32, copy=False) if count else empty,
            _offsets(segments),
            {name: np.concatenate([row.features[name] for row in rows]).astype(bool, copy=False) for name in names},
            np.asarray(plans, dtype=np.int64).reshape(-1),
            randoms,
        )

    @property
    def count(self) -> int:
        return int(self.offsets.shape[0] - 1)

    @property
    def lengths(self) -> np.ndarray:
        """Tokens of each row (int64)."""
        return np.diff(self.offsets)

    def matrix(self, rows: np.ndarray, length: int, values: np.ndarray | None = None) -> np.ndarray:
        """``(len(rows), length)``: ``values`` (default the tokens) of rows that all have ``length`` tokens."""
        values = self.tokens if values is None else values
        if rows.size == self.count and rows.size * length == values.shape[0]:
            return values.reshape(rows.size, length)  # every row: a view
        return values[self.offsets[rows][:, None] + np.arange(length)]

    def by_length(self, rows: np.ndarray | None = None) -> list[tuple[int, np.ndarray]]:
        """``(length, rows of that length)`` of ``rows`` (default all), longest first."""
        lengths = self.lengths
        rows = np.arange(self.count) if rows is None else rows
        values = lengths[rows]
        if values.size and (values == values[0]).all():
            return [(int(values[0]), rows)]
        return [(int(length), rows[values == length]) for length in np.unique(values)[::-1]]


def _offsets(lengths: np.ndarray) -> np.ndarray:
    out = np.zeros(lengths.shape[0] + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


def flat_rows(rows: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Rows end to end (int32) and their ``len(rows) + 1`` int64 offsets."""
    lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    values = np.concatenate(rows).astype(np.int32, copy=False) if len(rows) else np.zeros(0, np.int32)
    return values, _offsets(lengths)


def in_block_order(count: int, parts: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]]
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Rows made in parts, laid end to end in block order: ``(int32 values, count + 1 offsets)``.

    Args:
        count: rows of the block.
        parts: ``(rows, values, lengths)``: the block rows a part made, their values end to end
            in that order, and each one's length; together the parts make every row once.
    """
    if len(parts) == 1 and parts[0][0].shape[0] == count and (np.diff(parts[0][0]) == 1).all():
        _, values, lengths = parts[0]  # every row, in order
        return values.astype(np.int32, copy=False), _offsets(np.asarray(lengths, dtype=np.int64))
    lengths = np.zeros(count, dtype=np.int64)
    for rows, _, part_lengths in parts:
        lengths[rows] = part_lengths
    offsets = _offsets(lengths)
    values = np.empty(int(offsets[-1]), dtype=np.int32)
    for rows, part_values, part_lengths in parts:
        starts = np.repeat(offsets[rows] - _offsets(np.asarray(part_lengths, dtype=np.int64))[:-1], part_lengths)
        starts += np.arange(starts.shape[0])
        values[starts] = part_values
    return values, offsets


def padded_rows(values: np.ndarray, offsets: np.ndarray, width: int, pad: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Rows given end to end, each right-padded with ``pad`` to ``width``: ``(flat int32 values,
    int64 offsets, padding tokens)``.

    Raises:
        ValueError: a row longer than ``width``.
    """
    lengths = np.diff(offsets)
    count = lengths.shape[0]
    if count and int(lengths.max()) > width:
        raise ValueError(f"a row of {int(lengths.max())} tokens does not fit the fixed length {width}")
    padding = count * width - int(lengths.sum())
    if not padding:
        return values.astype(np.int32, copy=False), np.arange(count + 1, dtype=np.int64) * width, 0
    out = np.full((count, width), pad, dtype=np.int32)
    out[np.arange(width) < lengths[:, None]] = values
    return out.reshape(-1), np.arange(count + 1, dtype=np.int64) * width, padding


class TokenNeeds(NamedTuple):
    """The tokens an objective needs beyond the special roles (:meth:`Objective.token_needs`).

    Attributes:
        sentinels: how many sentinels ``<extra_id_0>``, ``<extra_id_1>``, ... it may use.
        tokens: other token strings it needs as single ids (UL2's mode tokens, a plugin's
            own markers), in order; they reach :meth:`Objective.build` as
            ``SpecialIds.mode_tokens`` (token -> id) and are never masked or replaced. The
            name ``mode_tokens`` (there and as the manifest's tokenizer key) is UL2's, kept
            because the manifest records it; it holds any objective's own tokens.
    """

    sentinels: int = 0
    tokens: tuple[str, ...] = ()


@dataclass(frozen=True)
class InspectionContext:
    """What every inspection hook of :class:`Objective` gets (``lmshards inspect``, ``show``,
    ``validate`` and ``report``, :mod:`loaders.inspection`): the dataset's facts, the split's,
    and the example's, as far as they are known at the hook's step (None before).

    The loader's records come by attribute (an ``Anatomy``, a ``SplitStats``), so objectives
    stay importable without the loader (numpy and the standard library only).

    Attributes:
        special: the dataset's special ids.
        seed: the dataset's seed (noise is a pure function of seed, example key and chunk).
        split: the split inspected ("" where none is, a single example taken apart alone).
        counters: the manifest's summed counters of the split (empty where it has none).
        manifest_summary: the manifest's summary of those counters (:meth:`Objective.summarize`),
            or None.
        stats: the split's statistics being counted (``loaders.inspection.stats.SplitStats``:
            ``counts``, ``lengths`` and the objective's own records, ``record(name, factory)``),
            while a split is measured.
        measured: the split's measured statistics as ``inspect --json`` prints them (the common
            ones and :meth:`Objective.measured_summary`'s), once measured.
        example: the stored example (column -> value), in the hooks of one example.
        anatomy: that example taken apart (``loaders.inspection.anatomy.Anatomy``: ``key``,
            ``lengths``, ``padding``, ``raw_tokens``, ``doc_lengths``, ``prefix_length(s)``,
            ``inputs``, ``targets``, ``issues`` and ``parts``, the objective's own record).
        decoder: the dataset's tokenizer as a ``loaders.inspection.decode.RunDecoder``
            (``token_bytes``, ``text``, ``sentence_starts``: a chunk's by the pipeline's rule), in
            :meth:`Objective.example_lines`; None where nothing is shown.
    """

    special: SpecialIds
    seed: int = 0
    split: str = ""
    counters: Mapping[str, int] = field(default_factory=dict)
    manifest_summary: Mapping[str, Any] | None = None
    stats: Any = None
    measured: Mapping[str, Any] | None = None
    example: Mapping[str, Any] | None = None
    anatomy: Any = None
    decoder: Any = None

    def known(self, **facts: Any) -> InspectionContext:
        """This context with more of the facts known (an example, its anatomy, the measured ...).

        Raises:
            TypeError: a name that is not a field.
        """
        unknown = facts.keys() - _CONTEXT_FIELDS
        if unknown:
            raise TypeError(f"InspectionContext has no field {sorted(unknown)}")
        # Called twice per inspected example: a copy of the fields, not dataclasses.replace's
        # __init__ call (a tenth of the time).
        out = object.__new__(InspectionContext)
        out.__dict__.update(self.__dict__)
        out.__dict__.update(facts)
        return out


_CONTEXT_FIELDS = frozenset(f.name for f in dataclasses.fields(InspectionContext))


class Objective(ABC):
    """What the pipeline, the loader and the inspection tools need of an objective.

    Subclasses set the class attributes and implement :meth:`build`, :meth:`schema_kwargs`
    and :meth:`params`; the other methods have defaults that fit an objective without noise
    statistics. Everything that depends on an objective is declared here, so the command
    line, the manifest summary, the loader and ``lmshards inspect`` / ``show`` / ``validate`` /
    ``report`` dispatch to the class: adding one touches its module, its tests and one line of
    :mod:`transforms.objectives.registry`.

    Attributes:
        name: objective name as on the command line (``clm``, ``mlm``, ...).
        family: example family of :mod:`schemas.examples` (``decoder``, ``encoder``, ``seq2seq``).
        config_class: the frozen dataclass of its parameters, taken by ``__init__``; its
            fields declared with :func:`transforms.objectives.flags.flag` are the objective's
            flags of ``lmshards materialize``, the others ``--config`` parameters only.
        features: per-token features :meth:`build` needs (from Tokenize: ``word_starts``,
            ``space_starts``, ``sentence_starts``).
        required_specials: special-token roles the objective needs (``"eos"``, ``"mask"``, ...);
            sentinels and tokens of its own are :meth:`token_needs`.
        fixed_raw_length: the raw length of every chunk, or None when :meth:`plan` varies it.
        length_parameter: the config field that sizes an example; the loader's on-the-fly
            objectives fit it to the stored chunks when it is not given (None: never).
        copies_chunks: examples are copies of their chunks, so sending a chunk to another
            worker and its example back costs as much as building it (``--build-stage auto``
            keeps such an objective where it is packed).
        decoder_start: the special role a seq2seq decoder starts with (collators, HF config).
        exact_counters: counters of :meth:`build` that the stored examples determine exactly,
            which ``lmshards validate`` recomputes from the shards (besides ``examples``,
            ``chunk_tokens`` and ``padding_tokens``); a name ending in ``*`` covers every
            counter that starts with it. :meth:`shard_counters` gives those an objective
            computes itself.
        example_groups: names of the groups of examples ``lmshards report`` shows one
            of each first (UL2's denoisers), read by :meth:`example_group`; empty for none.
        group_label: what a group is, in the report (``UL2 denoiser``).
        token_legend: ``(sample, meaning)`` of its own tokens (:meth:`token_needs`' tokens,
            shown as ``mode`` segments) in the legend of ``show`` and the report; None: the
            tokens themselves, "a token of the objective's own".
    """

    name: str
    family: str
    config_class: type
    features: frozenset[str] = frozenset()
    required_specials: frozenset[str] = frozenset({"eos"})
    fixed_raw_length: int | None = None
    length_parameter: str | None = "seq_len"
    copies_chunks: bool = False
    decoder_start: str = "pad"
    exact_counters: frozenset[str] = frozenset()
    example_groups: tuple[str, ...] = ()
    group_label: str = "group"
    token_legend: tuple[str, str] | None = None

    @staticmethod
    def summarize(counters: Mapping[str, int], params: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The manifest's ``objective_summary`` of a split's summed counters (pure: the shares a
        person checks, :mod:`transforms.objectives.summary`); by default the common part."""
        return common_summary(counters)

    @classmethod
    def config_from_params(cls, params: Mapping[str, Any]) -> dict[str, Any]:
        """The config fields from the manifest's ``params()`` record (which may add derived
        values): by default the fields of :attr:`config_class` found in it."""
        names = {f.name for f in dataclasses.fields(cls.config_class)}
        return {k: v for k, v in params.items() if k in names}

    # Inspection hooks (``lmshards inspect``, ``show``, ``validate`` and ``report``, :mod:`loaders.inspection`,
    # docs/design.md section 4): every one gets an InspectionContext.

    @property
    def seq2seq_in_decoder_rows(self) -> bool:
        """Decoder rows hold ``inputs + targets`` of one seq2seq example (``prefix_lengths`` the
        inputs), not document segments cut from the packed stream."""
        return False

    def take_apart(self, ctx: InspectionContext) -> None:
        """Complete ``ctx.anatomy`` from ``ctx.example``: the family's parts are filled in
        already (``lengths``, ``padding``, ``raw_tokens`` as the row's length (0 for seq2seq),
        ``doc_lengths`` and ``prefix_length(s)`` of a decoder row, unpadded ``inputs`` /
        ``targets``); set ``raw_tokens`` to the chunk tokens the example was made from
        (``lmshards validate`` adds them up against the manifest), ``parts`` to a record of the
        objective's own that its other hooks read, and append structural faults to
        ``anatomy.issues``. Called when the family's columns are there with their shapes (an
        issue may be recorded already); an exception it raises becomes an issue, and the
        example's other hooks are then not called. Nothing by default."""
        return None

    def example_problems(self, ctx: InspectionContext) -> list[str]:
        """What is wrong with one structurally sound example (no issues), beyond the family's
        checks: the objective's invariants and, where the chunk can be restored, its replay (the
        noise is a pure function of seed, key and chunk). Empty when sound."""
        return []

    def shard_counters(self, ctx: InspectionContext) -> dict[str, int]:
        """The counters of :attr:`exact_counters` recounted from one stored example, which
        ``lmshards validate`` adds up against the manifest; ``examples``, ``chunk_tokens`` and
        ``padding_tokens`` are counted for every objective."""
        return {}

    def count_measured(self, ctx: InspectionContext) -> None:
        """Count one example into the split's statistics ``ctx.stats``, beyond the common counts
        it keeps itself: integers into ``stats.counts`` under names of the objective's own, or
        into records of its own (``stats.record(name, factory)``); :meth:`measured_summary`
        turns them into statistics. Nothing by default."""
        return None

    def measured_summary(self, ctx: InspectionContext) -> dict[str, Any]:
        """The objective's part of ``lmshards inspect``'s statistics measured on the shards, from
        ``ctx.stats``, next to the configured values (merged into ``inspect --json``'s
        ``measured``). Nothing by default."""
        return {}

    def measured_lines(self, ctx: InspectionContext) -> list[str]:
        """The objective's lines of ``lmshards inspect``'s table (and of the report's summary),
        after a split's length rows: its statistics from ``ctx.measured`` beside the manifest's
        exact ``ctx.manifest_summary`` (None for a manifest without counters). Each line starts
        with two spaces; numbers formatted with :mod:`transforms.objectives.lines`. None by default."""
        return []

    def measured_charts(self, ctx: InspectionContext) -> list[Any]:
        """The objective's plots in the report's section of ``ctx.split``, after the common
        length plots: :class:`~transforms.objectives.lines.Chart` records, or a sentence
        (``str``) in place of a chart of one value, from ``ctx.measured`` and the split's
        manifest ``ctx.counters``. None by default."""
        return []

    def example_lines(self, ctx: InspectionContext) -> Shown:
        """How ``lmshards show`` and the report show one example: the header's facts and named
        lines of segments (:mod:`transforms.objectives.shown`), its noise made explicit. By
        default what its family shows (:func:`~transforms.objectives.shown.family_shown`)."""
        return family_shown(ctx)

    def example_group(self, ctx: InspectionContext) -> str | None:
        """The :attr:`example_groups` entry ``ctx.example`` belongs to (read before it is taken
        apart: ``ctx.anatomy`` is None)."""
        return None

    def plan(self, uniforms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Raw lengths and int plans of chunks, given one number in [0, 1) per chunk."""
        count = np.shape(uniforms)[0]
        return np.full(count, self.fixed_raw_length, dtype=np.int64), np.zeros(count, dtype=np.int64)

    @property
    def raw_lengths(self) -> tuple[int, ...]:
        """Every raw length :meth:`plan` may give (one for most objectives)."""
        return (self.fixed_raw_length,)

    @property
    def mean_raw_length(self) -> float:
        """Expected raw length of a chunk (shard sizing)."""
        return float(self.fixed_raw_length)

    @abstractmethod
    def build(self, block: Block, special: SpecialIds) -> Built:
        """The examples of every row of ``block`` and their summed counters."""

    @abstractmethod
    def schema_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of :func:`schemas.examples.example_schema` for this objective."""

    @abstractmethod
    def params(self) -> dict[str, Any]:
        """JSON-able parameters recorded in the manifest."""

    def max_sentinels(self) -> int:
        """Largest number of distinct sentinels one example may use (0 if none)."""
        return 0

    def token_needs(self) -> TokenNeeds:
        """The tokens this objective needs beyond its :attr:`required_specials` roles: the
        sentinels it may use and its own token strings, each a single id. What the plan's
        tokenizer check, ``--add-special-tokens`` (which adds what is missing in this order)
        and the loader's on-the-fly objectives ask; by default :meth:`max_sentinels` sentinels
        and no tokens of its own."""
        return TokenNeeds(self.max_sentinels(), ())

    @classmethod
    def preset_token_needs(cls) -> TokenNeeds:
        """The tokens this objective may need under any configuration a user picks by name (its
        defaults, and named presets such as UL2's mixtures), at its default lengths: what
        ``lmshards train-tokenizer`` makes for it (through the registry's ``tokens_needed``),
        so that a tokenizer trained with its defaults needs no ``--add-special-tokens``. By
        default the default config's :meth:`token_needs`; an objective with presets that need
        other tokens gives them all, in the order their ids should have."""
        return cls(cls.config_class()).token_needs()


def build_example(
    objective: Objective,
    tokens: np.ndarray,
    special: SpecialIds,
    randoms: Randoms,
    *,
    plan: int = 0,
    doc_lengths: np.ndarray | None = None,
    features: dict[str, np.ndarray] | None = None,
) -> tuple[dict[str, Any], dict[str, int]]:
    """One example as a block of one: ``(column -> value, counters)``.

    Array columns are int32 arrays (fixed-length ones padded as stored), scalar columns ints,
    string columns strings.

    Raises:
        ValueError: tokens that are not a 1-D integer array, features of another shape, or
            ``doc_lengths`` that do not add up to the chunk; and what the objective refuses.

    Args:
        objective: the objective.
        tokens: the chunk.
        special: special ids.
        randoms: the example's randoms (one row).
        plan: the chunk's plan.
        doc_lengths: document segment lengths of the chunk (default: one document).
        features: per-token features aligned with ``tokens``.
    """
    tokens = np.asarray(tokens)
    if tokens.ndim != 1 or tokens.dtype.kind not in "iu":
        raise ValueError(f"tokens must be a 1-D integer array, got shape {tokens.shape} dtype {tokens.dtype}")
    length = tokens.shape[0]
    if doc_lengths is None:
        doc_lengths = [length] if length else []
    doc_lengths = np.array(doc_lengths, dtype=np.int32).reshape(-1)
    if int(doc_lengths.sum()) != length or (doc_lengths.size and int(doc_lengths.min()) <= 0):
        raise ValueError(f"doc_lengths {doc_lengths.tolist()} must be positive and add up to {length} tokens")
    features = {name: np.asarray(values, dtype=bool) for name, values in (features or {}).items()}
    for name, values in features.items():
        if values.shape != tokens.shape:
            raise ValueError(f"{name} must have the shape of tokens {tokens.shape}, got {values.shape}")
    block = Block(tokens.astype(np.int32, copy=False), np.array([0, length], dtype=np.int64), doc_lengths,
                  np.array([0, doc_lengths.shape[0]], dtype=np.int64), features, np.array([plan], dtype=np.int64),
                  randoms)
    built = objective.build(block, special)
    example: dict[str, Any] = {name: values[offsets[0]:offsets[1]] for name, (values, offsets) in built.arrays.items()}
    example.update({name: int(values[0]) for name, values in built.scalars.items()})
    example.update({name: values[0] for name, values in built.strings.items()})
    return example, built.counters
