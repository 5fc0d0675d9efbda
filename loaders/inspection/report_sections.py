"""The report's tables, as HTML fragments: how the dataset was made (command line, run,
configuration, objective parameters, tokenizer), what it was made from (documents, input
files and their shares, document lengths, sources), the rejected records by reason with
samples, and the shard files (rows, tokens, bytes, sha256).

Every value comes from the manifest or ``rejected/`` and is untrusted: it is escaped, and
a long one is cut at :data:`MAX_VALUE_CHARS` characters.
"""

from __future__ import annotations

import html
import json
import shlex
from typing import Any

from loaders.inspection.corpus import document_length_bins, input_files, rejected_samples, source_stats
from loaders.inspection.figures import corpus_figures
from loaders.inspection.source import InspectedDataset, tokenizer_specials
from schemas.names import shown_name

__all__ = ["config_section", "corpus_section", "figure_html", "rejected_section", "run_section", "shards_section"]

MAX_VALUE_CHARS = 2000
MAX_SHARDS_LISTED = 64
_RUN_FIELDS = ("created_at", "lmshards_version", "output", "tokenizer_source", "input_patterns", "beam_args",
               "wall_seconds")


def _text(value: Any) -> str:
    if not isinstance(value, str):  # as the manifest spells it: null, true, [..], {..}
        value = json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)
    text = str(value)
    return html.escape(text if len(text) <= MAX_VALUE_CHARS else text[:MAX_VALUE_CHARS] + " ...")


def _num(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return _text("-" if value is None else value)
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.1f}" if abs(value) >= 1000 else f"{value:,.4g}"  # (4.878e+04 is no length to read)


def _table(header: list[str], rows: list[list[str]], cls: str = "") -> str:
    """A table of cells that are HTML already; numeric columns are right-aligned by class."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _pairs(items: list[tuple[str, Any]], cls: str = "kv") -> str:
    rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{v}</td></tr>" for k, v in items)
    return f'<table class="{cls}"><tbody>{rows}</tbody></table>'


def figure_html(caption: str, svg: str) -> str:
    return f"<figure>{svg}<figcaption>{html.escape(caption)}</figcaption></figure>"


def run_section(ds: InspectedDataset) -> str:
    """The command line and the facts of the run that made the dataset."""
    run = ds.manifest.run if isinstance(ds.manifest.run, dict) else {}
    argv = run.get("argv")
    command = "lmshards materialize " + shlex.join(str(a) for a in argv) if isinstance(argv, list) else None
    items = [(name, _text(run[name])) for name in _RUN_FIELDS if name in run]
    encoder = run.get("encoder")
    if isinstance(encoder, dict):
        probe = encoder.get("probe") if isinstance(encoder.get("probe"), dict) else {}
        described = " ".join(f"{k}={encoder[k]}" for k in sorted(encoder) if k not in ("probe",) and encoder[k])
        if probe:
            described += "; parity probe: " + " ".join(f"{k}={v}" for k, v in sorted(probe.items()))
        items.append(("encoder", _text(described)))
    parts = ['<section id="run"><h2>How it was made</h2>']
    if command:
        parts.append(f'<h3>Command line</h3><pre class="cmd">{_text(command)}</pre>')
    else:
        parts.append("<p>The manifest records no command line.</p>")
    parts.append("<h3>Run</h3>" + _pairs(items) + "</section>")
    return "".join(parts)


def _entries(name: str, value: list[Any]) -> str:
    """A list parameter of the objective (a mixture): a table of its dict entries, a column per key."""
    entries = [d for d in value if isinstance(d, dict)]
    keys = list(dict.fromkeys(k for d in entries for k in d))
    return _table(keys, [[_text(d.get(k, "")) for k in keys] for d in entries], name)


def _special_items(ds: InspectedDataset, tokenizer: dict[str, Any]) -> list[tuple[str, str]]:
    """Sentinels and the objective's own tokens: the tokenizer's own, and those the objective
    uses (the manifest's ``num_sentinels`` and ``mode_tokens``, under which the report lists
    them: 0 and none for an objective without such tokens, whatever the tokenizer has)."""
    own_sentinels, own_modes = tokenizer_specials(ds)
    items = []
    if "num_sentinels" in tokenizer or own_sentinels is not None:
        used = tokenizer.get("num_sentinels", 0)
        items.append(("sentinels", _text(f"{own_sentinels if own_sentinels is not None else '?'} in the tokenizer, "
                                         f"{used} used by the objective")))
    used_modes = tokenizer.get("mode_tokens") or {}
    if used_modes or own_modes:
        shown = " ".join(own_modes) if own_modes else "none"
        items.append(("mode_tokens", _text(f"{shown} in the tokenizer; used by the objective: "
                                           + (" ".join(f"{k}={v}" for k, v in used_modes.items()) or "none"))))
    return items


def config_section(ds: InspectedDataset) -> str:
    """Configuration, objective parameters and tokenizer, as the manifest records them."""
    m = ds.manifest
    config = m.config if isinstance(m.config, dict) else {}
    objective = m.objective if isinstance(m.objective, dict) else {}
    params = objective.get("params") if isinstance(objective.get("params"), dict) else {}
    tokenizer = m.tokenizer if isinstance(m.tokenizer, dict) else {}
    plain = [(k, _text(v)) for k, v in sorted(params.items()) if not isinstance(v, list)]
    lists = "".join(f"<h3>{html.escape(k.capitalize())}</h3>{_entries(k, v)}"
                    for k, v in sorted(params.items()) if isinstance(v, list))
    token_items = [(k, _text(tokenizer[k])) for k in ("file", "vocab_size", "source_vocab_size", "sha256",
                                                      "special_ids", "roles") if k in tokenizer]
    token_items += _special_items(ds, tokenizer)
    if isinstance(tokenizer.get("added_tokens"), list):
        added = tokenizer["added_tokens"]
        token_items.append(("added_tokens", _text(f"{len(added)}: " + " ".join(map(str, added[:40]))
                                                  + (" ..." if len(added) > 40 else "")) if added
                            else "none (the tokenizer had every token the objective needs)"))
    return ('<section id="config"><h2>Configuration</h2><div class="columns">'
            f'<div><h3>Config</h3>{_pairs([(k, _text(v)) for k, v in sorted(config.items())])}</div>'
            f'<div><h3>Objective {_text(objective.get("name", "?"))} ({_text(objective.get("family", "?"))})</h3>'
            f'{_pairs(plain)}</div>'
            f'<div><h3>Tokenizer</h3>{_pairs(token_items)}</div></div>{lists}</section>')


def _share_cell(share: float | None) -> str:
    if share is None:
        return "-"
    return (f'<span class="share"><span class="sharebar" style="width:{100 * share:.1f}%"></span></span>'
            f"{100 * share:.1f}%")


def corpus_section(ds: InspectedDataset) -> str:
    """Document accounting, input files and their shares, document lengths, sources."""
    m = ds.manifest
    counts = m.counts if isinstance(m.counts, dict) else {}
    accounting = [(k.replace("_", " "), _num(counts.get(k))) for k in
                  ("documents_read", "documents_written", "duplicates", "rejected", "filtered") if k in counts]
    repaired = counts.get("repaired")
    if isinstance(repaired, dict) and any(repaired.values()):
        accounting.append(("repaired", _text(", ".join(f"{k} {v:,}" for k, v in repaired.items() if v))))
    files = input_files(ds)
    file_rows = [[f'<span class="path">{_text(shown_name(f["path"]))}</span>', _num(f["bytes"]),
                  _share_cell(f["share"])] for f in files["files"]]
    if files["more_files"]:
        file_rows.append([f"... {files['more_files']:,} more files", _num(files["more_bytes"]),
                          _share_cell(files["more_bytes"] / files["total_bytes"] if files["total_bytes"] else None)])
    bins, length_rows = {}, []
    for split in ds.splits:
        lengths = m.stats.get(split, {}).get("document_lengths") if isinstance(m.stats, dict) else None
        if isinstance(lengths, dict):
            bins[split] = document_length_bins(lengths.get("log2_histogram"))
            length_rows.append([_text(split)] + [_num(lengths.get(k)) for k in ("count", "sum", "mean", "min", "max")])
    parts = ['<section id="corpus"><h2>Corpus</h2><div class="columns">',
             f"<div><h3>Documents</h3>{_pairs(accounting)}</div>",
             f"<div><h3>Document lengths (tokens)</h3>"
             f"{_table(['split', 'documents', 'tokens', 'mean', 'min', 'max'], length_rows, 'num')}</div></div>",
             f"<h3>Input files ({files['total_files']:,} files, {files['total_bytes']:,} bytes)</h3>",
             _table(["file", "bytes", "share of bytes"], file_rows, "files num") if file_rows else
             "<p>The manifest lists no input files.</p>"]
    source_rows = []
    for split in ds.splits:
        sources = source_stats(ds, split)
        documents, tokens = sum(s["documents"] for s in sources.values()), sum(s["tokens"] for s in sources.values())
        for name, s in sources.items():
            source_rows.append([_text(split), _text(name), _num(s["documents"]),
                                _share_cell(s["documents"] / documents if documents else None), _num(s["tokens"]),
                                _share_cell(s["tokens"] / tokens if tokens else None),
                                _num(round(s["tokens"] / s["documents"], 1) if s["documents"] else None)])
    if source_rows:
        parts.append('<h3 id="sources">Sources</h3>' + _table(
            ["split", "source", "documents", "share", "tokens", "share", "mean length"], source_rows, "num"))
    parts += [figure_html(caption, svg) for caption, svg in corpus_figures(ds, bins)]
    parts.append("</section>")
    return "".join(parts)


def rejected_section(ds: InspectedDataset, per_reason: int = 3) -> str:
    """Rejected records by reason, with up to ``per_reason`` samples each."""
    found = rejected_samples(ds, per_reason)
    read = ds.manifest.counts.get("documents_read") if isinstance(ds.manifest.counts, dict) else None
    parts = ['<section id="rejected"><h2>Rejected records</h2>']
    reasons = dict(found["by_reason"])
    for reason in found["samples"]:
        reasons.setdefault(reason, 0)
    if not reasons:
        parts.append("<p>No record was rejected.</p></section>")
        return "".join(parts)
    rows = []
    for reason, count in sorted(reasons.items(), key=lambda item: (-item[1], item[0])):
        samples = "".join(
            f'<div class="sample"><span class="where">{_text(s["source"])}:{_text(s["position"])}</span>'
            f'<pre class="excerpt">{_text(s["excerpt"]) or "(empty)"}</pre></div>'
            for s in found["samples"].get(reason, []))
        share = count / read if isinstance(read, int) and read else None
        rows.append([_text(reason), _num(count), _share_cell(share), samples or "(no sample in rejected/)"])
    parts.append(_table(["reason", "records", "share of read", f"samples (up to {per_reason})"], rows, "rejected"))
    if not found["complete"]:
        parts.append(f"<p>Samples come from the first {found['lines_read']:,} rejected records.</p>")
    for problem in found["problems"]:
        parts.append(f'<p class="problem">{_text(problem)}</p>')
    parts.append("</section>")
    return "".join(parts)


def shards_section(ds: InspectedDataset, chart: tuple[str, str]) -> str:
    """Tokens per shard and the shard files (rows, tokens, bytes, sha256)."""
    rows = []
    notes = []
    for split in ds.splits:
        shards = ds.shards(split)
        for shard in shards[:MAX_SHARDS_LISTED]:
            for fmt, info in sorted(shard.files.items()):
                rows.append([_text(split), _num(shard.index), _num(shard.rows), _num(shard.tokens), _text(fmt),
                             _num(info.bytes), f'<code class="sha">{_text(info.sha256)}</code>'])
        if len(shards) > MAX_SHARDS_LISTED:
            notes.append(f"<p>{split}: the first {MAX_SHARDS_LISTED} of {len(shards):,} shards are listed; "
                         "manifest.json has them all.</p>")
    return ('<section id="shards"><h2>Shards</h2>' + figure_html(*chart)
            + _table(["split", "shard", "rows", "tokens", "format", "bytes", "sha256"], rows, "shards num")
            + "".join(notes) + "</section>")
