"""Which kernel gives other bits on another CPU: a fingerprint of every op of one training step.

Builds the default preset's model (arm prenorm_clip1, torch seed 1) on fixed inputs drawn from a
seeded generator, runs one forward and backward pass, and writes the sha256 of the output of every
module (forward hooks, in call order), of every parameter's gradient, and of a set of single ops at
the model's shapes (linear, matmul, conv1d, layer norm, GELU, softmax, scaled-dot-product attention,
cdist). Run it on two machines and compare the files: the first entry that differs names the op
whose kernel differs, on identical inputs.

    python benchmarks/kernel_fingerprint.py --out fingerprint.json            # pinned (cpu_kernels: avx2)
    python benchmarks/kernel_fingerprint.py --native --out fingerprint.json   # this CPU's own kernels
    python benchmarks/kernel_fingerprint.py --compare a.json b.json           # the first difference
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path


def digest(t) -> str:
    return hashlib.sha256(t.detach().contiguous().float().numpy().tobytes()).hexdigest()[:16]


def fingerprint(config: Path) -> dict:
    import torch
    import torch.nn.functional as F

    from acoustic_mlm import config as C
    from acoustic_mlm import kernels
    from acoustic_mlm.model.objective import AcousticMLM

    torch.set_num_threads(1)
    cfg = C.load(config)
    m = cfg.model_for("prenorm_clip1")
    torch.manual_seed(1)
    model = AcousticMLM(m)
    g = torch.Generator().manual_seed(0)
    batch, seconds = 8, 1.0
    frames = int(75 * seconds)
    wav = 0.1 * torch.randn(batch, frames * 320, generator=g)
    codes = torch.randint(0, m.codebook_size, (batch, m.codebooks, frames), generator=g)
    mask = torch.rand(batch, frames, generator=g) < 0.5
    out: dict[str, str] = {}

    def hook(name):
        def fn(_module, _args, output):
            tensors = output if isinstance(output, tuple) else (output,)
            for i, t in enumerate(tensors):
                if isinstance(t, torch.Tensor) and t.is_floating_point():
                    out[f"forward {name}[{i}]"] = digest(t)

        return fn

    for name, module in model.named_modules():
        if name:
            module.register_forward_hook(hook(name))
    result = model(wav, codes, mask)
    loss = result.loss if hasattr(result, "loss") else result[0]
    loss.backward()
    out["loss"] = digest(loss)
    for name, p in model.named_parameters():
        if p.grad is not None:
            out[f"grad {name}"] = digest(p.grad)
    d, h = m.dim, m.heads
    x = torch.randn(batch * frames, d, generator=g)
    w = torch.randn(m.ffn_dim, d, generator=g)
    q, k, v = (torch.randn(batch, h, frames, d // h, generator=g) for _ in range(3))
    ops = {
        "op linear (B*T, D) x (F, D)": lambda: F.linear(x, w),
        "op matmul (D x D)": lambda: x[:d] @ x[:d].T,
        "op conv1d front end layer 0": lambda: F.conv1d(
            wav[:, None],
            torch.randn(m.conv_layers[0][0], 1, m.conv_layers[0][1], generator=g),
            stride=m.conv_layers[0][2],
        ),
        "op layer_norm": lambda: F.layer_norm(x, (d,)),
        "op gelu": lambda: F.gelu(x),
        "op softmax": lambda: x.softmax(-1),
        "op scaled_dot_product_attention": lambda: F.scaled_dot_product_attention(q, k, v),
        "op cdist": lambda: torch.cdist(x[:256], x[256:512]),
    }
    for name, fn in ops.items():
        out[name] = digest(fn())
    import os

    from acoustic_mlm.report.verify import cpu_vendor

    machine = {"vendor": cpu_vendor(), "MKL_CBWR": os.environ.get("MKL_CBWR")}  # MKL's branch, when a user sets one
    return {"kernels": kernels.report(), "machine": machine, "torch": torch.__version__, "fingerprint": out}


def compare(a: Path, b: Path) -> int:
    fa, fb = (json.loads(Path(p).read_text())["fingerprint"] for p in (a, b))
    differ = [k for k in fa if fa.get(k) != fb.get(k)]
    print(f"{len(differ)} of {len(fa)} entries differ")
    for k in differ[:20]:
        print(f"  {k}: {fa.get(k)} / {fb.get(k)}")
    return 1 if differ else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, default=Path("config/config.yaml"))
    ap.add_argument("--native", action="store_true", help="leave the CPU kernels as this machine picks them")
    ap.add_argument("--out", type=Path, default=Path("results/kernel_fingerprint.json"))
    ap.add_argument("--compare", type=Path, nargs=2, default=None, metavar="JSON")
    a = ap.parse_args()
    if a.compare:
        return compare(*a.compare)
    if not a.native:
        from acoustic_mlm.kernels import pin

        for problem in pin():
            print(f"warning: {problem}", file=sys.stderr)
    result = fingerprint(a.config)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = a.out.with_name(a.out.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    tmp.replace(a.out)
    print(
        f"{len(result['fingerprint'])} entries, torch capability {result['kernels']['torch_cpu_capability']} -> {a.out}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
