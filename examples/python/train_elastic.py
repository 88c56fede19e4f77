#!/usr/bin/env python3
"""Elastic data-parallel training from Python (docs/python.md, "Elastic
training"): the section classifier of train_sections.py (a bag of byte
bigrams over the Debian package descriptions) trained by members of a
dpkit.elastic group that meet through a store. Members may die (the others
go on within seconds, without restarting) and processes may join (they are
healed from a member's state); every sample of an epoch is trained once.

    xz -dk data/debian-descriptions.jsonl.xz
    # three members on this machine, through a directory (ids unique in the job):
    for i in 0 1 2; do
      python examples/python/train_elastic.py --store file:///tmp/job1 --id $i --first-size 3 \\
          --data data/debian-descriptions.jsonl --steps 200 &
    done
    kill -9 %2                      # a member dies: the other two go on
    python examples/python/train_elastic.py --store file:///tmp/job1 --id 3 --first-size 3 \\
        --data data/debian-descriptions.jsonl --steps 200    # joins, healed from the others
    # across machines: --store redis://host:6379/job1 (redis-server), GLOO_SOCKET_IFNAME=eth0

Output (the master's lines: "step S generation G world W loss L ..."; every
member's "joined generation ..." after each heal, with the state's
checksum) and logs (--sample-log DIR) as torch_lm --elastic writes them, so
scripts/torch_elastic_check.py --check-only and scripts/plot_loss_svg.py
read both; scripts/elastic_cluster_demo.sh runs it on the emulated cluster
(PYTHON=...).
"""
import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

import dpkit
import dpkit.elastic


class BagOfBigrams(torch.nn.Module):
    def __init__(self, classes, dim=32):
        super().__init__()
        self.emb = torch.nn.EmbeddingBag(1 << 16, dim, mode="mean")
        self.out = torch.nn.Linear(dim, classes)

    def forward(self, flat, offsets):
        return self.out(self.emb(flat, offsets))


def bigrams(rows, sections, max_bytes=256):
    flat, offsets, labels = [], [], []
    for r in rows:
        b = r["text"].encode("utf-8")[:max_bytes]
        offsets.append(len(flat))
        flat.extend(b[i] << 8 | b[i + 1] for i in range(len(b) - 1))
        if len(b) < 2:
            flat.append(0)
        labels.append(sections[r["section"]])
    return torch.tensor(flat, dtype=torch.long), torch.tensor(offsets), torch.tensor(labels)


class LineLog:
    """One file per process; each line one write(2), wall time first."""

    def __init__(self, path):
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) if path else -1

    def put(self, body):
        if self.fd < 0:
            return
        line = ("%.3f %s\n" % (time.time(), body)).encode()
        if os.write(self.fd, line) != len(line):
            raise RuntimeError("short write to the sample log")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--store", required=True, help="file:///abs/dir or redis://host:port/job")
    ap.add_argument("--id", type=int, required=True, help="this member's id: unique in the job, never reused")
    ap.add_argument("--first-size", type=int, default=1, help="members the job starts with")
    ap.add_argument("--data", required=True, help="the JSONL corpus (text, section, num_tokens)")
    ap.add_argument("--limit-samples", type=int, default=0, help="train on the first N lines only")
    ap.add_argument("--max-tokens", type=int, default=256, help="token budget of one member's batch")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--steps", type=int, default=1 << 40)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--heartbeat", type=float, default=0.2, help="seconds between heartbeats")
    ap.add_argument("--dead-after", type=float, default=2.0, help="seconds without a heartbeat: dead")
    ap.add_argument("--announce-wait", type=float, default=0.0,
                    help="seconds a re-formation waits for live members of the last generation to take part "
                         "(default: 4 x --dead-after; see ElasticGroup)")
    ap.add_argument("--step-deadline", type=float, default=0.0, help="seconds (0: off); see ElasticGroup")
    ap.add_argument("--step-timeout", type=float, default=60.0, help="each collective's deadline (s)")
    ap.add_argument("--no-majority", action="store_true", help="re-form without a majority of the last generation")
    ap.add_argument("--sample-log", default="", help="directory of the per-process logs (torch_lm's format)")
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--threads", type=int, default=0, help="torch's intra-op threads (0: the CPUs it may run on)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads or max(1, len(os.sched_getaffinity(0))))
    ident = args.id
    log = LineLog(os.path.join(args.sample_log, "id%d.log" % ident) if args.sample_log else "")

    ds = dpkit.JsonlDataset(args.data, length_field="num_tokens", progress=False)
    n = min(len(ds), args.limit_samples) if args.limit_samples > 0 else len(ds)
    lengths = ds.lengths()[:n]
    sections = {s: i for i, s in enumerate(sorted({ds[i]["section"] for i in range(len(ds))}))}

    def make_sampler(world, rank):
        # elastic: one global batch sequence whatever the world size; truncate keeps every sample
        return dpkit.TokenBudgetBatchSampler(lengths, args.max_tokens, world, rank, max_sample_tokens=args.max_tokens,
                                             oversize="truncate", elastic=True, seed=17)

    torch.manual_seed(0)  # the job's initial state: equal on every member of the first generation
    model = BagOfBigrams(len(sections))
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    group = dpkit.elastic.ElasticGroup(args.store, ident, first_size=args.first_size,
                                       heartbeat_interval=args.heartbeat, dead_after=args.dead_after,
                                       announce_wait=args.announce_wait or 4 * args.dead_after, majority=not args.no_majority,
                                       step_timeout=args.step_timeout, step_deadline=args.step_deadline or None)

    def on_heal(h):
        log.put("J %d %d %d %d %d %d %d %s %d %s" % (h.generation, ident, h.rank, h.world_size, h.step, h.epoch,
                                                     h.offset, h.checksum, h.source,
                                                     ",".join(str(m) for m in h.members)))
        print("train_elastic: id %d joined generation %d: rank %d of %d, step %d, epoch %d, offset %d, params "
              "checksum %s (from rank %d)" % (ident, h.generation, h.rank, h.world_size, h.step, h.epoch, h.offset,
                                              h.checksum, h.source), flush=True)
        if h.reason:
            print("train_elastic: id %d: re-formed after: %s" % (ident, h.reason[:400]), flush=True)

    trainer = dpkit.elastic.ElasticTrainer(group, model, opt, make_sampler, on_heal=on_heal)
    while trainer.epoch < args.epochs and trainer.step_count < args.steps:
        batch = trainer.next_batch()
        if trainer.epoch >= args.epochs:
            break
        idx, pad, pos = batch
        step, epoch, offset, gen, world = trainer.step_count, trainer.epoch, trainer.offset, group.generation, group.size
        log.put("S %d %d %d %d %d %d %s" % (gen, step, epoch, pos, group.rank, 1 if pad else 0,
                                            " ".join(str(i) for i in idx)))

        def compute(indices):
            flat, offsets, labels = bigrams([ds[i] for i in indices], sections)
            return F.cross_entropy(model(flat, offsets), labels)

        loss = trainer.step(compute, batch)
        if loss is None:
            continue  # discarded: a member failed; the group re-formed and healed
        cks = dpkit.elastic.state_checksum(model)
        log.put("A %d %d %d %d %s" % (gen, step, epoch, offset, cks))
        if group.rank == 0 and args.log_every > 0 and step % args.log_every == 0:
            print("step %d generation %d world %d loss %.4f (rank 0's batch) params %s" %
                  (step, gen, world, loss.item(), cks), flush=True)
    cks = dpkit.elastic.state_checksum(model)
    log.put("D %d %d %d %s" % (ident, trainer.step_count, trainer.epoch, cks))
    print("train_elastic: id %d done: step %d, epoch %d, generation %d, params checksum %s" %
          (ident, trainer.step_count, trainer.epoch, group.generation, cks), flush=True)
    group.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
