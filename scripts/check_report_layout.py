#!/usr/bin/env python3
"""Lay out an `lmshards report` page in headless Chromium and list what does not fit.

Usage:
  lmshards report OUT -o report.html
  scripts/check_report_layout.py report.html [--width 1400] [--json]

A copy of the page gets a small script that, once the page has loaded at the given
window width, measures it in the browser:

- every element whose content is wider than its box (scrollWidth > clientWidth where the
  overflow is clipped or scrolled: text cut off or hidden behind a scroll bar), and every
  element, inline runs included (getClientRects), that sticks out of its parent's box;
- in every SVG chart: text outside the chart, and text that overlaps other text (an
  axis label over its ticks, tick labels over each other, the legend over the title);
- the page wider than the window;
- what the page holds: its height, section ids, chart titles, example headers.

Chromium's --dump-dom prints the DOM with the script's findings; this prints them (JSON with
--json) and exits 1 when anything does not fit, 3 without a Chromium. Same browser flags as
scripts/render_report.sh (no sandbox, no GPU, no network). Standard library only.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

PROBE = r"""
<script>
(function () {
  const out = {overflow: [], outside: [], chart_text: [], page: {}, sections: [], charts: [], examples: []};
  const name = (el) => el.tagName.toLowerCase() + (el.id ? '#' + el.id : '') +
    (el.className && typeof el.className === 'string' ? '.' + el.className.trim().split(/\s+/).join('.') : '');
  const text = (el) => (el.textContent || '').trim().slice(0, 80);
  const root = document.documentElement;
  out.page = {scrollWidth: root.scrollWidth, clientWidth: root.clientWidth, scrollHeight: root.scrollHeight};
  for (const el of document.body.querySelectorAll('*')) {
    if (el.closest('svg') || el.tagName === 'SCRIPT' || el.id === 'layout-probe') continue;
    const style = getComputedStyle(el);
    if (style.overflowX !== 'visible' && el.scrollWidth > el.clientWidth + 1) {
      out.overflow.push({element: name(el), scrollWidth: el.scrollWidth, clientWidth: el.clientWidth, text: text(el)});
    }
    const parent = el.parentElement;
    if (!parent || parent === document.body.parentElement) continue;
    const box = parent.getBoundingClientRect();
    for (const rect of el.getClientRects()) {
      if (rect.width && (rect.right > box.right + 1 || rect.left < box.left - 1)) {
        out.outside.push({element: name(el), parent: name(parent), right: Math.round(rect.right),
                          parent_right: Math.round(box.right), text: text(el)});
        break;
      }
    }
  }
  for (const svg of document.querySelectorAll('svg')) {
    const title = svg.getAttribute('aria-label') || '';
    out.charts.push(title);
    const box = svg.getBoundingClientRect();
    const texts = [...svg.querySelectorAll('text')].filter((t) => t.textContent.trim())
      .map((t) => [t, t.getBoundingClientRect()]);
    for (const [t, r] of texts) {
      if (r.left < box.left - 1 || r.right > box.right + 1 || r.top < box.top - 1 || r.bottom > box.bottom + 1) {
        out.chart_text.push({chart: title, problem: 'outside the chart', text: t.textContent});
      }
    }
    for (let i = 0; i < texts.length; i++) {
      for (let j = i + 1; j < texts.length; j++) {
        const a = texts[i][1], b = texts[j][1];
        const dx = Math.min(a.right, b.right) - Math.max(a.left, b.left);
        const dy = Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top);
        if (dx > 1 && dy > 1) {
          out.chart_text.push({chart: title, problem: 'overlap', text: texts[i][0].textContent + ' / ' +
                               texts[j][0].textContent});
        }
      }
    }
  }
  out.sections = [...document.querySelectorAll('section[id]')].map((s) => s.id);
  out.examples = [...document.querySelectorAll('.example .header')].map((h) => h.textContent);
  const pre = document.createElement('pre');
  pre.id = 'layout-probe';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
</script>
"""


def find_browser() -> str | None:
    return os.environ.get("CHROMIUM") or next(
        (b for b in (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")) if b), None)


def measure(page: str, width: int = 1400, browser: str | None = None) -> dict:
    """The probe's findings for the HTML file ``page`` laid out ``width`` px wide."""
    browser = browser or find_browser()
    if browser is None:
        raise FileNotFoundError("no chromium found (apt-get install -y chromium, or set CHROMIUM)")
    with open(page, encoding="utf-8") as handle:
        text = handle.read()
    probed = text.replace("</body>", PROBE + "</body>") if "</body>" in text else text + PROBE
    with tempfile.TemporaryDirectory() as scratch:
        copy = os.path.join(scratch, "probed.html")
        with open(copy, "w", encoding="utf-8") as handle:
            handle.write(probed)
        result = subprocess.run(
            [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
             f"--user-data-dir={os.path.join(scratch, 'profile')}", f"--window-size={width},1000", "--dump-dom",
             f"file://{copy}"], capture_output=True, text=True, timeout=120)
    found = re.search(r'<pre id="layout-probe">(.*?)</pre>', result.stdout, re.S)
    if not found:
        raise RuntimeError(f"the probe did not run (exit {result.returncode}): {result.stderr[-2000:]}")
    return json.loads(html.unescape(found.group(1)))


def problems(found: dict) -> list[str]:
    """One line per element that does not fit."""
    out = [f"overflow: {p['element']} content {p['scrollWidth']} px in {p['clientWidth']} px: {p['text']!r}"
           for p in found["overflow"]]
    out += [f"outside: {p['element']} ends at {p['right']} px, its parent {p['parent']} at {p['parent_right']} px: "
            f"{p['text']!r}" for p in found["outside"]]
    out += [f"chart {p['chart']!r}: {p['problem']}: {p['text']!r}" for p in found["chart_text"]]
    page = found["page"]
    if page["scrollWidth"] > page["clientWidth"] + 1:
        out.append(f"page: {page['scrollWidth']} px wide in a {page['clientWidth']} px window")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="List what does not fit in an lmshards report page.")
    parser.add_argument("page", help="the report's HTML file")
    parser.add_argument("--width", type=int, default=1400, help="window width in px (default 1400)")
    parser.add_argument("--json", action="store_true", help="print the probe's findings as JSON")
    args = parser.parse_args(argv)
    try:
        found = measure(args.page, args.width)
    except FileNotFoundError as exc:
        print(f"{sys.argv[0]}: {exc}", file=sys.stderr)
        return 3
    listed = problems(found)
    if args.json:
        print(json.dumps({**found, "problems": listed}, indent=2))
    else:
        print("\n".join(listed) if listed else f"{args.page}: everything fits at {args.width} px")
    return 1 if listed else 0


if __name__ == "__main__":
    sys.exit(main())
