"""One member of the elastic test (scripts/torch_elastic_check.py --python):
dpkit.elastic.ElasticTrainer over a file store, writing the same log lines
as torch_lm --elastic (one file per process, each line one write(2) before
the step's collective; wall time first):

    T J gen id rank world step epoch offset checksum source members   after a heal
    T S gen step epoch position rank pad id...                        before a step
    T A gen step epoch offset checksum                                step applied here
    T F id where step                                                 a fault injected
    T D id step epoch checksum                                        finished

Fault injection (--control DIR): DIR/fail.<id> names where this process ends
itself with os._exit(3): "join" (right after joining, before the heal),
"before" (the next step, before forward), "during" (in the step, while the
other members wait for it in the gradients' all-reduce), "after" (after the
next step was applied), "sleep" (once, in the next step's forward: the
main thread sleeps 8 s with the heartbeat alive, then goes on); while
DIR/pace exists each step sleeps 100 ms. --step-deadline S sets the group's
step deadline.

The data: N_SAMPLES samples with lengths 1..15 and a budget of 32 tokens
(every sample kept: oversize truncate), or with --sampler distributed
dpkit.DistributedSampler (torch's order, --batch-size samples per member
per step); the model an embedding of the
sample id and a small MLP regressing a function of it.
"""
import argparse
import os
import sys
import time

import torch

import dpkit
from dpkit.elastic import ElasticGroup, ElasticTrainer, state_checksum

N_SAMPLES = 1500


class Log:
    def __init__(self, path):
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def put(self, body):
        line = ("%.3f %s\n" % (time.time(), body)).encode()
        if os.write(self.fd, line) != len(line):
            raise RuntimeError("short write to the sample log")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--store", required=True)
    ap.add_argument("--id", type=int, required=True)
    ap.add_argument("--first-size", type=int, default=3)
    ap.add_argument("--logs", required=True)
    ap.add_argument("--control", required=True)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--step-deadline", type=float, default=0.0)
    ap.add_argument("--sampler", choices=("token-budget", "distributed"), default="token-budget")
    ap.add_argument("--batch-size", type=int, default=4, help="--sampler distributed: samples per member per step")
    args = ap.parse_args()
    torch.set_num_threads(1)
    ident = args.id
    log = Log(os.path.join(args.logs, "id%d.log" % ident))

    def control_fault():
        try:
            with open(os.path.join(args.control, "fail.%d" % ident)) as f:
                return f.read().split()[0]
        except (OSError, IndexError):
            return ""

    def fault(where, step):
        log.put("F %d %s %d" % (ident, where, step))
        sys.stderr.write("elastic_worker: id %d: fault injected (%s, step %d)\n" % (ident, where, step))
        sys.stderr.flush()
        os._exit(3)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(N_SAMPLES, 8), torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=50, gamma=0.9)
    lengths = [1 + (i * 7919) % 15 for i in range(N_SAMPLES)]

    def make_sampler(world, rank):
        if args.sampler == "distributed":
            return dpkit.DistributedSampler(N_SAMPLES, world, rank, seed=5)
        return dpkit.TokenBudgetBatchSampler(lengths, 32, world, rank, max_sample_tokens=15, oversize="truncate",
                                             elastic=True, seed=5)

    group = ElasticGroup(args.store, ident, first_size=args.first_size, heartbeat_interval=0.05, dead_after=0.6,
                         announce_wait=2.4, majority=False, step_timeout=30.0,
                         step_deadline=args.step_deadline or None, hostname="127.0.0.1")
    if control_fault() == "join":
        fault("join", -1)

    def on_heal(h):
        log.put("J %d %d %d %d %d %d %d %s %d %s" % (h.generation, ident, h.rank, h.world_size, h.step, h.epoch,
                                                     h.offset, h.checksum, h.source,
                                                     ",".join(str(m) for m in h.members)))
        print("elastic_worker: id %d joined generation %d: rank %d of %d, step %d, epoch %d, offset %d, checksum %s "
              "(from rank %d), shm %s" % (ident, h.generation, h.rank, h.world_size, h.step, h.epoch, h.offset,
                                          h.checksum, h.source, group.shm_messages), flush=True)

    trainer = ElasticTrainer(group, model, opt, make_sampler, scheduler=sched, on_heal=on_heal,
                             batch_size=args.batch_size if args.sampler == "distributed" else None)
    flags = {"slept": False}
    while trainer.epoch < args.epochs:
        batch = trainer.next_batch()
        if trainer.epoch >= args.epochs:
            break
        idx, pad, pos = batch
        f = control_fault()
        step, epoch, offset, gen = trainer.step_count, trainer.epoch, trainer.offset, group.generation
        if f == "before":
            fault(f, step)
        log.put("S %d %d %d %d %d %d %s" % (gen, step, epoch, pos, group.rank, 1 if pad else 0,
                                            " ".join(str(i) for i in idx)))

        def compute(indices):
            x = torch.tensor(indices, dtype=torch.long)
            target = torch.sin(x.double() / 100.0).float().unsqueeze(1)
            loss = torch.nn.functional.mse_loss(model(x), target)
            if f == "during":
                fault(f, step)  # the others are in the gradients' all-reduce, waiting for this member
            if f == "sleep" and not flags["slept"]:
                log.put("F %d sleep %d" % (ident, step))
                print("elastic_worker: id %d: sleeping 8 s in step %d (heartbeat alive)" % (ident, step), flush=True)
                time.sleep(8)
                flags["slept"] = True
            return loss

        if trainer.step(compute, batch) is not None:
            log.put("A %d %d %d %d %s" % (gen, step, epoch, offset, state_checksum(model)))
            if f == "after":
                fault(f, step)
        if os.path.exists(os.path.join(args.control, "pace")):
            time.sleep(0.1)
    log.put("D %d %d %d %s" % (ident, trainer.step_count, trainer.epoch, state_checksum(model)))
    print("elastic_worker: id %d done: step %d, epoch %d, generation %d, checksum %s" %
          (ident, trainer.step_count, trainer.epoch, group.generation, state_checksum(model)), flush=True)
    group.close()


if __name__ == "__main__":
    main()
