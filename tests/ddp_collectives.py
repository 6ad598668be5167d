"""Run under torchrun (gloo): count the collectives of `train.update` per update; write them as JSON.

    python -m torch.distributed.run --standalone --nproc_per_node 2 tests/ddp_collectives.py CONFIG OUT_DIR

Gradient collectives are counted by a DDP communication hook (each bucket it all-reduces, with its
bytes); scalar ones by wrapping torch.distributed.all_reduce outside that hook.
"""

import dataclasses
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from acoustic_mlm import config as C
from acoustic_mlm.preflight.measure import synthetic_batch
from acoustic_mlm.train.distributed import init_distributed
from acoustic_mlm.train.schedule import lr_at
from acoustic_mlm.train.update import build_trainer, update

UPDATES = 3


def main(config: str, out_dir: str) -> None:
    rank, world = init_distributed("cpu")
    torch.set_num_threads(1)
    cfg = C.load(config)
    m, t = cfg.model_for("prenorm_clip1"), cfg.train_for("prenorm_clip1")
    t = dataclasses.replace(t, compile=False)
    device = torch.device("cpu")
    tr = build_trainer(m, t, device, rank, world)
    log = {"grad": [], "scalar": [], "grad_bytes": tr.grad_bytes(), "accum_steps": t.accum_steps, "world": world}
    inside_hook = [False]
    real_all_reduce = dist.all_reduce

    def counting_all_reduce(tensor, *args, **kwargs):
        if not inside_hook[0]:
            log["scalar"][-1].append(tensor.numel())
        return real_all_reduce(tensor, *args, **kwargs)

    def hook(state, bucket):
        log["grad"][-1].append(bucket.buffer().numel() * bucket.buffer().element_size())
        inside_hook[0] = True
        try:
            return default_hooks.allreduce_hook(state, bucket)
        finally:
            inside_hook[0] = False

    tr.ddp.register_comm_hook(None, hook)
    dist.all_reduce = counting_all_reduce
    frames = cfg.crop_frames
    for u in range(UPDATES):
        log["grad"].append([])
        log["scalar"].append([])
        micro = []
        for i in range(t.accum_steps):  # the global micro-batch drawn whole, rows rank, rank + world, ... kept
            wav, codes, mask = synthetic_batch(m, t.batch_size, frames, device, seed=100 * u + i)
            micro.append((wav[rank::world], codes[rank::world], mask[rank::world]))
        result = update(tr, micro, lr_at(u + 1, t))
        assert result.finite
    dist.all_reduce = real_all_reduce
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(log))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
