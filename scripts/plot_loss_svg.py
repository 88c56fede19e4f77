#!/usr/bin/env python3
"""Plots a loss curve as a self-contained SVG (no plotting library needed):
reads torch_lm's "step S generation G world W loss L ..." lines from stdin
(the master's log), draws loss against step, and marks each change of
generation with a vertical line labelled with the world size.

    grep -h '^step ' out/id*.txt | sort -k2 -n -u | scripts/plot_loss_svg.py "title" > loss.svg
"""
import sys


def main() -> None:
    title = sys.argv[1] if len(sys.argv) > 1 else "loss"
    pts = []  # (step, generation, world, loss)
    for line in sys.stdin:
        r = line.split()
        if len(r) >= 8 and r[0] == "step" and r[2] == "generation" and r[4] == "world" and r[6] == "loss":
            pts.append((int(r[1]), int(r[3]), int(r[5]), float(r[7])))
    if not pts:
        sys.exit("plot_loss_svg: no 'step S generation G world W loss L' lines on stdin")
    pts.sort()
    W, H, L, R, T, B = 720, 360, 60, 20, 40, 40
    s0, s1 = pts[0][0], max(pts[-1][0], pts[0][0] + 1)
    lo, hi = min(p[3] for p in pts), max(p[3] for p in pts)
    hi = hi if hi > lo else lo + 1
    x = lambda s: L + (s - s0) / (s1 - s0) * (W - L - R)
    y = lambda v: T + (hi - v) / (hi - lo) * (H - T - B)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{W / 2}" y="20" text-anchor="middle" font-size="14">{title}</text>',
           f'<line x1="{L}" y1="{H - B}" x2="{W - R}" y2="{H - B}" stroke="black"/>',
           f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H - B}" stroke="black"/>',
           f'<text x="{W / 2}" y="{H - 8}" text-anchor="middle">step</text>',
           f'<text x="14" y="{H / 2}" transform="rotate(-90 14 {H / 2})" text-anchor="middle">loss</text>']
    for k in range(5):
        v = lo + (hi - lo) * k / 4
        out.append(f'<text x="{L - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:.2f}</text>')
        st = s0 + (s1 - s0) * k / 4
        out.append(f'<text x="{x(st):.1f}" y="{H - B + 16}" text-anchor="middle">{st:.0f}</text>')
    prev = None
    for s, g, w, _ in pts:
        if prev is not None and g != prev:
            out.append(f'<line x1="{x(s):.1f}" y1="{T}" x2="{x(s):.1f}" y2="{H - B}" stroke="#c33" stroke-dasharray="4 3"/>')
            out.append(f'<text x="{x(s) + 3:.1f}" y="{T + 12}" fill="#c33">gen {g}: {w} ranks</text>')
        prev = g
    path = " ".join(f"{x(s):.1f},{y(v):.1f}" for s, _, _, v in pts)
    out.append(f'<polyline points="{path}" fill="none" stroke="#236" stroke-width="1.5"/>')
    out.append("</svg>")
    print("\n".join(out))


if __name__ == "__main__":
    main()
