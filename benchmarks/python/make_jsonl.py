#!/usr/bin/env python3
"""Writes a synthetic JSONL file of N lines for the DataLoader memory
benchmark (dataloader_memory.py): line i is
{"id": i, "text": "<8-40 letters>", "num_tokens": <1-64>}, about 60 bytes,
deterministic (a linear congruential sequence). Written to PATH.tmp and
renamed, so a partial file is never left under PATH.

    python3 benchmarks/python/make_jsonl.py 200000000 /data/lines-2e8.jsonl
"""
import os
import sys

WORDS = [w * k for w in ("ab", "cde", "fghi", "jklmn") for k in (2, 4, 8)]


def main() -> None:
    n, path = int(sys.argv[1]), sys.argv[2]
    tmp = path + ".tmp"
    block = 1_000_000
    with open(tmp, "w", buffering=1 << 24) as f:
        for start in range(0, n, block):
            end = min(n, start + block)
            f.write("".join(
                f'{{"id": {i}, "text": "{WORDS[(i * 2654435761) % 12]}", "num_tokens": {(i * 40503) % 64 + 1}}}\n'
                for i in range(start, end)))
            if start % (20 * block) == 0:
                print(f"{end} / {n} lines", file=sys.stderr, flush=True)
    os.replace(tmp, path)


if __name__ == "__main__":
    main()
