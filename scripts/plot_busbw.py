#!/usr/bin/env python3
"""Plot bus bandwidth vs message size from dpkit *_perf results.

Reads the CSV (--csv FILE) or JSON (-J FILE) a dpkit benchmark wrote and draws
busbw (GB/s) against size (bytes, log2 axis), one line per algorithm. With
several types / ops / roots in one file, pick them with --type/--op/--root
(default: the first of each found in the file).

    allreduce_perf -b 8 -e 256M -f 2 -A all --csv ar.csv
    scripts/plot_busbw.py ar.csv -o ar.png            # out-of-place busbw
    scripts/plot_busbw.py ar.json --in-place -o ar_ip.png

Needs matplotlib only for drawing; without it (or with --table) the series
are printed as text instead.
"""

import argparse
import csv
import json
import sys
from collections import OrderedDict


def load(path):
    """Returns a list of dicts: algorithm, size, type, redop, root, oop_busbw, ip_busbw, collective, nranks."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    rows = []
    if text.lstrip().startswith("{"):
        doc = json.loads(text)
        # nccl-tests 2.19 layout (dpkit's facts under "dpkit"); older dpkit files had them at the top
        meta = doc.get("dpkit", doc)
        for r in doc.get("results", []):
            rows.append({
                "collective": meta.get("collective", ""),
                "nranks": meta.get("nranks", ""),
                "algorithm": r.get("algorithm", r.get("experiment_name", "?")),
                "size": int(r["size"]),
                "type": r.get("type", ""),
                "redop": r.get("redop", ""),
                "root": int(r.get("root", -1)),
                "oop_busbw": float(r["out_of_place"]["bus_bw"]),
                "ip_busbw": float(r["in_place"]["bus_bw"]),
            })
    else:
        for r in csv.DictReader(text.splitlines()):
            rows.append({
                "collective": r.get("collective", ""),
                "nranks": r.get("nranks", ""),
                "algorithm": r["algorithm"],
                "size": int(r["size"]),
                "type": r["type"],
                "redop": r["redop"],
                "root": int(r["root"]),
                "oop_busbw": float(r["oop_busbw"]),
                "ip_busbw": float(r["ip_busbw"]),
            })
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", help="CSV (--csv) or JSON (-J) file from a dpkit *_perf benchmark")
    ap.add_argument("-o", "--output", default="busbw.png", help="image to write (default busbw.png)")
    ap.add_argument("--in-place", action="store_true", help="plot the in-place busbw instead of out-of-place")
    ap.add_argument("--type", help="element type to plot (default: the first in the file)")
    ap.add_argument("--op", help="reduction op to plot (default: the first in the file)")
    ap.add_argument("--root", type=int, help="root to plot (default: the first in the file)")
    ap.add_argument("--table", action="store_true", help="print the series as text, do not plot")
    args = ap.parse_args()

    rows = load(args.results)
    if not rows:
        sys.exit(f"{args.results}: no results")
    pick_type = args.type or rows[0]["type"]
    pick_op = args.op or rows[0]["redop"]
    pick_root = args.root if args.root is not None else rows[0]["root"]
    key = "ip_busbw" if args.in_place else "oop_busbw"
    series = OrderedDict()
    for r in rows:
        if r["type"] != pick_type or r["redop"] != pick_op or r["root"] != pick_root:
            continue
        series.setdefault(r["algorithm"], []).append((r["size"], r[key]))
    if not series:
        sys.exit(f"{args.results}: nothing for type={pick_type} op={pick_op} root={pick_root}")
    title = "{} {} ranks, {} {}, {}".format(rows[0]["collective"], rows[0]["nranks"], pick_type, pick_op,
                                           "in-place" if args.in_place else "out-of-place")

    plt = None
    if not args.table:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt  # noqa: F811
        except ImportError:
            print("plot_busbw.py: matplotlib is not installed (pip install matplotlib); printing the series instead",
                  file=sys.stderr)
    if plt is None:
        print(f"# {title}: busbw (GB/s)")
        for algo, pts in series.items():
            print(f"# algorithm {algo}")
            for size, bw in pts:
                print(f"{size:12d}  {bw:8.3f}")
        return

    fig, ax = plt.subplots(figsize=(8, 5))
    for algo, pts in series.items():
        pts = [p for p in pts if p[0] > 0]  # log axis: drop size 0
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3, label=algo)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.output, dpi=120)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
