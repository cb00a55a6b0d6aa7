#!/usr/bin/env python3
"""Draws a troupe trace (--trace FILE, Chrome trace-event JSON) as an SVG timeline.

One band per host (process), one row per actor or thread in it, each span a box coloured by its
name, nested spans drawn inside their parent; a time axis in seconds since the first span. Use it
where no browser is at hand (docs/tracing.md has one); Perfetto shows the same file interactively.

    scripts/trace_svg.py TRACE.json OUT.svg [--from 2.0] [--to 2.5] [--width 1200] [--title TEXT]

--from/--to pick a window (seconds on the trace's axis); spans crossing its edges are clipped.
Standard library only.
"""

import argparse
import json
import sys
from collections import defaultdict
from html import escape

COLOURS = {
    "step": "#d62728", "eval": "#9467bd", "augment": "#2ca02c", "push": "#1f77b4",
    "credit wait": "#ff7f0e", "wait": "#e377c2", "pool work": "#c7c7c7",
}
CATEGORY_COLOURS = {"actor": "#17becf", "pool": "#c7c7c7", "stream": "#aec7e8", "train": "#98df8a"}
ROW_H, LABEL_W, HEADER_H, AXIS_H, LEGEND_H = 16, 300, 20, 28, 24


def colour(event):
    return COLOURS.get(event["name"], CATEGORY_COLOURS.get(event.get("cat"), "#bcbd22"))


def load(path):
    with open(path) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    processes, threads, spans = {}, {}, defaultdict(list)
    for e in events:
        key = (e["pid"], e["tid"])
        if e["ph"] == "M" and e["name"] == "process_name":
            processes[e["pid"]] = e["args"]["name"]
        elif e["ph"] == "M" and e["name"] == "thread_name":
            threads[key] = e["args"]["name"]
        elif e["ph"] == "X":
            spans[key].append(e)
    return processes, threads, spans


def depths(row):
    """Each span's nesting depth within its row (the file's rows nest: troupe assigns lanes)."""
    out, open_ends = [], []
    for e in sorted(row, key=lambda e: (e["ts"], -e["dur"])):
        while open_ends and open_ends[-1] <= e["ts"]:
            open_ends.pop()
        out.append((e, len(open_ends)))
        open_ends.append(e["ts"] + e["dur"])
    return out


def row_order(name):
    # The event loop first, then actors, then pool threads.
    if name == "event loop":
        return (0, name)
    if name.startswith("pool thread"):
        return (2, int(name.split()[-1]) if name.split()[-1].isdigit() else 0)
    return (1, name)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace")
    p.add_argument("out")
    p.add_argument("--from", dest="start", type=float, help="window start, seconds")
    p.add_argument("--to", dest="end", type=float, help="window end, seconds")
    p.add_argument("--width", type=int, default=1200, help="pixels of the time axis")
    p.add_argument("--title", default="")
    args = p.parse_args()
    try:
        processes, threads, spans = load(args.trace)
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"trace_svg: cannot read '{args.trace}' as a Chrome trace-event file: {e}")
    all_spans = [e for row in spans.values() for e in row]
    if not all_spans:
        sys.exit(f"trace_svg: '{args.trace}' has no spans ('X' events)")
    origin = min(e["ts"] for e in all_spans)
    t0 = origin + (args.start or 0) * 1e6
    t1 = origin + args.end * 1e6 if args.end is not None else max(e["ts"] + e["dur"] for e in all_spans)
    if t1 <= t0:
        sys.exit(f"trace_svg: the window --from {args.start} --to {args.end} is empty")
    scale = args.width / (t1 - t0)

    body, y = [], HEADER_H + (22 if args.title else 0)
    used = set()
    pids = sorted({pid for pid, _ in spans} | set(processes))
    for pid in pids:
        rows = sorted([k for k in set(spans) | set(threads) if k[0] == pid],
                      key=lambda k: row_order(threads.get(k, str(k[1]))))
        body.append(f'<rect x="0" y="{y}" width="{LABEL_W + args.width}" height="{HEADER_H}" '
                    f'fill="#333"/><text x="6" y="{y + 14}" fill="#fff" font-weight="bold">'
                    f'{escape(processes.get(pid, f"pid {pid}"))}</text>')
        y += HEADER_H
        if not rows:
            body.append(f'<text x="6" y="{y + 12}" fill="#888">(no spans)</text>')
            y += ROW_H
        for index, key in enumerate(rows):
            fill = "#f4f4f4" if index % 2 == 0 else "#fff"
            body.append(f'<rect x="0" y="{y}" width="{LABEL_W + args.width}" height="{ROW_H}" '
                        f'fill="{fill}"/><text x="6" y="{y + 12}">'
                        f'{escape(threads.get(key, "thread " + str(key[1]))[:48])}</text>')
            for e, depth in depths(spans.get(key, [])):
                start, end = max(e["ts"], t0), min(e["ts"] + e["dur"], t1)
                if end < start or (end == start and e["dur"] > 0):
                    continue
                inset = min(depth * 3, 6)
                x = LABEL_W + (start - t0) * scale
                w = max((end - start) * scale, 0.5)
                used.add((e["name"], colour(e)))
                body.append(f'<rect x="{x:.2f}" y="{y + 1 + inset}" width="{w:.2f}" '
                            f'height="{ROW_H - 2 - 2 * inset}" fill="{colour(e)}">'
                            f'<title>{escape(e["name"])}: {e["dur"] / 1000:.3f} ms</title></rect>')
            y += ROW_H
    # Time axis: about ten ticks at a round step.
    span_s = (t1 - t0) / 1e6
    step = 10 ** len(str(int(span_s * 1000 / 10))) / 1000 if span_s > 0 else 1
    while span_s / step > 12:
        step *= 2
    while span_s / step < 4:
        step /= 2
    axis = [f'<line x1="{LABEL_W}" y1="{y + 2}" x2="{LABEL_W + args.width}" y2="{y + 2}" '
            f'stroke="#000"/>']
    tick = 0.0
    while tick <= span_s + 1e-9:
        x = LABEL_W + tick * 1e6 * scale
        label = (t0 - origin) / 1e6 + tick
        axis.append(f'<line x1="{x:.1f}" y1="{y + 2}" x2="{x:.1f}" y2="{y + 7}" stroke="#000"/>'
                    f'<text x="{x:.1f}" y="{y + 19}" text-anchor="middle">{label:.3g} s</text>')
        tick += step
    y += AXIS_H
    legend, x = [], 6
    for name, fill in sorted(used):
        legend.append(f'<rect x="{x}" y="{y + 4}" width="12" height="12" fill="{fill}"/>'
                      f'<text x="{x + 16}" y="{y + 14}">{escape(name)}</text>')
        x += 24 + 7 * len(name)
    y += LEGEND_H
    title = (f'<text x="6" y="16" font-size="14" font-weight="bold">{escape(args.title)}</text>'
             if args.title else "")
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{LABEL_W + args.width}" height="{y}" '
           f'font-family="sans-serif" font-size="11">\n<rect width="100%" height="100%" '
           f'fill="#fff"/>\n{title}\n' + "\n".join(body + axis + legend) + "\n</svg>\n")
    with open(args.out, "w") as f:
        f.write(svg)


if __name__ == "__main__":
    main()
