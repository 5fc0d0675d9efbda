"""An example as a header and named lines of segments, its noise made explicit.

:func:`render_example` turns one stored example (taken apart by
:mod:`loaders.inspection.anatomy`) into what ``lmshards show`` and the report print: the
objective's hook (``Objective.example_lines``, docs/design.md section 4) gives the facts and
the lines, built from :mod:`transforms.objectives.shown`'s segments; here they get the
example's place in front and its structural issues at the end. An example whose parts are
incomplete (a missing column, a hook that failed on it) is shown by its family alone.

How segments become text, ANSI colour or HTML is :mod:`loaders.inspection.render`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from loaders.inspection.anatomy import Anatomy, ObjectiveView
from loaders.inspection.source import Located
from transforms.objectives.base import InspectionContext
from transforms.objectives.shown import Segment, family_shown

__all__ = ["RenderedExample", "Segment", "render_example"]


@dataclass
class RenderedExample:
    """A header and named lines of segments; ``token_legend`` is ``(sample, meaning)`` of the
    objective's own tokens in the legend (None: :data:`~loaders.inspection.render.legend`'s own)."""

    header: str
    lines: list[tuple[str, list[Segment]]]
    token_legend: tuple[str, str] | None = None


def render_example(located: Located, a: Anatomy, view: ObjectiveView, *, seed: int | None = None,
                   decoder: Any = None, context: InspectionContext | None = None) -> RenderedExample:
    """The lines that show one example (see the module docstring).

    Args:
        seed: the dataset's seed (noise is replayed from it; default the context's).
        decoder: a :class:`~loaders.inspection.decode.RunDecoder` of the dataset's tokenizer, for
            an objective that recovers its noise from the text.
        context: what the objective's hook gets for the example's split (default the view's).
    """
    ctx = context or view.context(located.split)
    if seed is not None:
        ctx = ctx.known(seed=seed)
    ctx = ctx.known(example=located.example, anatomy=a, decoder=decoder)
    objective = view.objective
    shown = objective.example_lines(ctx) if a.complete else family_shown(ctx)
    facts = [f"split={located.split}", f"shard={located.shard}", f"row={located.row}", *shown.facts]
    if a.issues:
        facts.append("ISSUES: " + "; ".join(a.issues))
    legend = objective.token_legend
    if legend is None and view.special.mode_tokens:
        legend = (" ".join(view.special.mode_tokens), "a token of the objective's own")
    return RenderedExample(f"{a.key}  " + "  ".join(facts), shown.lines, legend)
