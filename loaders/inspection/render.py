"""Examples decoded with their corruption made visible, for ``lmshards show`` and the report.

:mod:`loaders.inspection.segments` turns an example into named lines of segments (the
objective's hook builds them, :mod:`transforms.objectives.shown`); this module prints them by
segment kind, as plain text (markers a pipe or ``grep`` can read), as ANSI colour on a
terminal, or as HTML:

- ``[MASK:orig]``, ``[RAND:shown->orig]``, ``[KEEP:orig]``: selected tokens, and what a
  ``<mask>`` (or random token) hides; ``[+MASK]``/``[+RAND:x]``: inserted noise,
  ``[DEL:text]``: deleted text; ``[#k]``: where sentence ``k`` of the original starts;
- ``<extra_id_k>``: sentinels (each span in its sentinel's colour; ``[<extra_id_k>: span]``
  in the restored chunk);
- ``[/prefix]``: the prefix/suffix boundary; ``[/doc]``: a document boundary;
- the objective's own tokens (``mode`` segments, as its ``token_legend`` says); ``<pad>*N``: N
  padding tokens; ``[MASK*N:orig]`` and ``[+MASK*N]``: N ``<mask>`` tokens in a row
  (neighbouring masks are shown as one run); every ``*N`` the text uses has its line in the legend;
- a line break of the text is a real line break after ``↵``; other control characters are
  escaped (``\\t``), and bytes of a character the sequence holds only part of are ``\\xNN``.

The runs of one line are decoded together (:class:`~loaders.inspection.decode.RunDecoder`),
so byte-level pieces of one character never show as U+FFFD. Text output wraps at
``width`` columns, continuation lines indented under the line's name. With ``ids=True``
an id line follows each text line.
"""

from __future__ import annotations

import html
import unicodedata
from typing import Any

from loaders.inspection.decode import RunDecoder
from loaders.inspection.segments import RenderedExample, Segment, render_example

__all__ = ["RenderedExample", "Segment", "legend", "legend_html", "legend_text", "render_example",
           "segment_strings", "to_html", "to_text"]

NEWLINE_MARK = "\u21b5"
_PALETTE = ("33", "35", "36", "32", "34", "31")
_HTML_PALETTE = ("#b58900", "#d33682", "#2aa198", "#859900", "#268bd2", "#dc322f")
_ANSI = {"mask": "1;37;41", "random": "30;43", "kept": "4;32", "prefix": "36", "mode": "1;37;44",
         "special": "2", "pad": "2", "boundary": "1;35", "sentence": "1;35", "insert": "1;37;45",
         "deleted": "9;31", "hidden": "4;31", "newline": "2"}
_UNMARKED = frozenset({"text", "prefix"})

#: Legend entries: key, sample markup, segment kind (its colour), meaning.
_LEGEND = (
    ("mask", "[MASK:orig]", "mask", "a <mask> the model sees; orig is what it must predict there"),
    ("mask_run", "[MASK*N:orig]", "mask", "N <mask> tokens in a row; orig is the N tokens they hide"),
    ("mask_token", "<mask>", "mask", "a <mask> token of the inputs"),
    ("random", "[RAND:shown->orig]", "random", "a random token shown in place of orig"),
    ("kept", "[KEEP:orig]", "kept", "selected but shown unchanged; still predicted"),
    ("insert", "[+MASK]", "insert", "noise inserted where nothing was removed ([+RAND:x]: a random token)"),
    ("insert_run", "[+MASK*N]", "insert", "N <mask> tokens inserted in a row"),
    ("deleted", "[DEL:text]", "deleted", "text deleted from the inputs"),
    ("sentence", "[#k]", "sentence", "sentence k of the original text starts here (shows how sentences moved)"),
    ("hidden", "hidden text", "hidden", "in targets: the text the noise hid, which the model must restore"),
    ("sentinel", "<extra_id_k>", "sentinel", "a sentinel; its span in targets has the same colour"),
    ("restored_span", "[<extra_id_k>:span]", "span", "a noise span back in place (restored line)"),
    ("doc", "[/doc]", "boundary", "a document boundary"),
    ("prefix", "[/prefix]", "boundary", "end of the prefix (bidirectional before, causal after)"),
    ("mode", "[T]", "mode", "a token of the objective's own"),  # as the examples' token_legend says
    ("pad", "<pad>*N", "pad", "N padding tokens"),
    ("newline", NEWLINE_MARK, "newline", "a line break of the text (longer lines are wrapped)"),
    ("bytes", "\\xNN", "text", "a byte of a character that is only partly in this sequence"),
)


def _escape(text: str) -> str:
    """Control characters escaped, line breaks kept."""
    return "".join(c if c.isprintable() or c in " \n" else repr(c)[1:-1] for c in text)


def _decoder(tokenizer: Any) -> RunDecoder:
    return tokenizer if isinstance(tokenizer, RunDecoder) else RunDecoder(tokenizer)


def _markup(segment: Segment, stream: str, shown: str) -> str:
    kind = segment.kind
    if kind == "boundary":
        return f"[/{segment.label}]"
    if kind == "sentence":
        return f"[{segment.label}]"
    if kind == "pad":
        return f"{shown.strip()}*{len(segment.ids)}"
    if kind == "mask" and segment.original is not None:
        return f"[MASK:{stream}]" if len(segment.ids) == 1 else f"[MASK*{len(segment.ids)}:{stream}]"
    if kind == "random":
        return f"[RAND:{shown}->{stream}]"
    if kind == "kept":
        return f"[KEEP:{stream}]"
    if kind == "insert":
        if segment.original is None and shown.replace("<mask>", ""):
            return f"[+RAND:{shown}]"
        return "[+MASK]" if len(segment.ids) == 1 else f"[+MASK*{len(segment.ids)}]"
    if kind == "deleted":
        return f"[DEL:{stream}]"
    if kind == "span" and segment.label:
        return f"[{segment.label}:{stream}]"
    return stream


def segment_strings(segments: list[Segment], tokenizer: Any, ids: bool = False) -> list[str]:
    """What each segment of one line prints (see the module docstring); ``tokenizer`` may be a
    :class:`~loaders.inspection.decode.RunDecoder`."""
    if ids:
        streams = [" ".join(str(t) for t in s.stream_ids()) for s in segments]
        shown = [" ".join(str(t) for t in (s.ids[:1] if s.kind == "pad" else s.ids)) for s in segments]
    else:
        decoder = _decoder(tokenizer)
        streams = decoder.texts([s.stream_ids() for s in segments], [s.kind not in _UNMARKED for s in segments])
        shown = [decoder.text(s.ids[:1] if s.kind == "pad" else s.ids) if s.kind in ("random", "insert", "pad")
                 else "" for s in segments]
    return [_escape(_markup(s, stream, show)) for s, stream, show in zip(segments, streams, shown)]


def _ansi(kind: str, group: int = 0) -> str | None:
    if kind in ("sentinel", "span"):
        return ("1;" if kind == "sentinel" else "") + _PALETTE[group % len(_PALETTE)]
    return _ANSI.get(kind)


def _columns(char: str) -> int:
    if unicodedata.combining(char):
        return 0
    return 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1


def _layout(prefix: str, styled: list[tuple[str, str | None]], width: int | None) -> list[str]:
    """Lines of ``prefix`` + styled text: real line breaks after a ``↵``, wrapped at ``width``
    columns (at a space where one is in reach), continuation lines indented."""
    coloured = any(code is not None for _, code in styled)
    cells: list[tuple[str, str | None]] = []
    for text, code in styled:
        for char in text:
            if char == "\n":
                cells.append((NEWLINE_MARK, _ANSI["newline"] if coloured else None))
            cells.append((char, code))
    rows: list[list[tuple[str, str | None]]] = [[]]
    used = 0
    room = max(width - len(prefix), 20) if width else None
    for cell in cells:
        if cell[0] == "\n":
            rows.append([])
            used = 0
            continue
        size = _columns(cell[0])
        if room is not None and used + size > room and rows[-1]:
            row = rows[-1]
            cut = next((i for i in range(len(row) - 1, 0, -1) if row[i][0] == " "), None)
            rows[-1], carried = (row[: cut + 1], row[cut + 1 :]) if cut is not None else (row, [])
            rows.append(carried)
            used = sum(_columns(c) for c, _ in carried)
        rows[-1].append(cell)
        used += size
    out = []
    for number, row in enumerate(rows):
        text, run, code = [], [], None
        for char, char_code in row + [("", "end")]:
            if char_code != code and run:
                text.append(f"\x1b[{code}m{''.join(run)}\x1b[0m" if code else "".join(run))
                run = []
            code = char_code
            run.append(char)
        out.append((prefix if number == 0 else " " * len(prefix)) + "".join(text))
    return out


def to_text(rendered: RenderedExample, tokenizer: Any, *, color: bool = False, ids: bool = False,
            width: int | None = None) -> str:
    """Plain or ANSI-coloured text, wrapped at ``width`` columns (None: not wrapped); with
    ``ids``, an id line follows each text line."""
    bold = "1" if color else None
    out = _layout("── ", [(rendered.header, bold)], width)
    label_width = max((len(name) for name, _ in rendered.lines), default=0)
    decoder = _decoder(tokenizer)
    for name, segments in rendered.lines:
        for show_ids in (False, True) if ids else (False,):
            strings = segment_strings(segments, decoder, show_ids)
            styled: list[tuple[str, str | None]] = []
            for number, (segment, text) in enumerate(zip(segments, strings)):
                if show_ids and number:
                    styled.append((" ", None))
                styled.append((text, _ansi(segment.kind, segment.group) if color else None))
            label = name if not show_ids else "ids"
            out += _layout(f"{label:>{label_width}}: ", styled, width)
    return "\n".join(out) + "\n"


def _html_text(text: str) -> str:
    return html.escape(text).replace("\n", f'<span class="nl">{NEWLINE_MARK}</span>\n')


def to_html(rendered: RenderedExample, tokenizer: Any) -> str:
    """An HTML fragment (``<div class="example">``) with the segments as styled ``<span>``s."""
    decoder = _decoder(tokenizer)
    rows = []
    for name, segments in rendered.lines:
        parts = []
        for segment, text in zip(segments, segment_strings(segments, decoder)):
            style = ""
            if segment.kind in ("sentinel", "span"):
                style = f' style="color:{_HTML_PALETTE[segment.group % len(_HTML_PALETTE)]}"'
            parts.append(f'<span class="seg {segment.kind}"{style}>{_html_text(text)}</span>')
        rows.append(f'<div class="line"><span class="name">{html.escape(name)}</span>'
                    f'<span class="text">{"".join(parts)}</span></div>')
    return (f'<div class="example"><div class="header">{html.escape(rendered.header)}</div>'
            f'{"".join(rows)}</div>')


def legend(examples: list[RenderedExample], *, colour: bool = True) -> list[tuple[str, str, str]]:
    """``(sample, kind, meaning)`` of the markup these examples use (``hidden`` text is visible
    only in colour; the objective's own tokens as its ``token_legend`` says)."""
    keys = {"newline", "bytes"}
    own = next((example.token_legend for example in examples if example.token_legend), None)
    for example in examples:
        for _, segments in example.lines:
            for s in segments:
                kind = s.kind
                if kind == "mask":
                    keys.add("mask_token" if s.original is None else "mask" if len(s.ids) == 1 else "mask_run")
                elif kind == "insert":  # several ids: [+MASK*N], or [+RAND:x] when they are not all <mask>
                    keys.update(("insert", "insert_run") if len(s.ids) > 1 else ("insert",))
                elif kind == "span":
                    keys.add("restored_span" if s.label else "sentinel")
                elif kind == "boundary":
                    keys.add(s.label)
                elif kind in ("random", "kept", "deleted", "sentence", "sentinel", "mode", "pad"):
                    keys.add(kind)
                elif kind == "hidden" and colour:
                    keys.add(kind)
    return [(own[0], kind, own[1]) if key == "mode" and own else (sample, kind, meaning)
            for key, sample, kind, meaning in _LEGEND if key in keys]


def legend_text(examples: list[RenderedExample], *, color: bool = False) -> str:
    """The legend as text lines for ``lmshards show``."""
    entries = legend(examples, colour=color)
    width = max(len(sample) for sample, _, _ in entries)
    lines = ["markup:"]
    for sample, kind, meaning in entries:
        code = _ansi(kind) if color else None
        shown = f"\x1b[{code}m{sample}\x1b[0m" if code else sample
        lines.append(f"  {shown}{' ' * (width - len(sample))}  {meaning}")
    return "\n".join(lines) + "\n"


def legend_html(examples: list[RenderedExample]) -> str:
    """The legend as an HTML list for the report."""
    items = "".join(f'<li><span class="seg {kind}">{html.escape(sample)}</span> {html.escape(meaning)}</li>'
                    for sample, kind, meaning in legend(examples))
    return f'<ul class="legend">{items}</ul>'
