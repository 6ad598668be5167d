#!/usr/bin/env bash
# The GPU measurements in one prepared run: a machine with one GPU, under 8.5 minutes, results as JSON.
#
#   bash benchmarks/gpu_check.sh                   # run everything on the GPU -> results/gpu_check/gpu_check.json
#   bash benchmarks/gpu_check.sh --only gpu_mfu    # one step (or several, comma-separated) of the list below
#   bash benchmarks/gpu_check.sh --dry-run         # print every command and check it on CPU (configs, options); no GPU
#
# Runs from the repository root. The package is imported from src/ (PYTHONPATH=src is added), so an
# image whose torch is newer than the pin (issue 34: torch 2.11) needs no `pip install -e .`, which would
# replace its torch; the other dependencies must be installed (snakemake for step 1).
#   1. benchmarks/smoke_cuda.py: the smoke pipeline end to end on CUDA, every arm, one killed (SIGKILL)
#      after its first resumable states and resumed by the rerun;
#   2. benchmarks/gpu_mfu.py: MFU of gpu-small and paper (one process's micro-batch) in fp16_fairseq
#      and bf16, before (nnAudio's CQT, cuDNN front end), with the FFT CQT, and after (FFT CQT, front
#      end as matmuls);
#   3-4. amlm preflight of gpu-small and of paper in their own fp16_fairseq (paper: 8 processes per
#      node on one GPU, so one process measured and the node projected);
#   5. benchmarks/train_throughput.py at gpu-small size: the four arms against nn.TransformerEncoder,
#      one model at a time;
#   6. benchmarks/relax_fp16.py: PB-Relax against plain attention in fp16 on the same inputs;
#   7. benchmarks/tokenize_throughput.py on the GPU at EnCodec batches 1, 4 and 16;
#   8. benchmarks/data_throughput.py: the pretrained EnCodec encoder on the GPU at the GPU presets' batch
#      (16 clips of 30 s of real music; the recordings from ../shared/audio/librosa or $AMLM_REAL_AUDIO).
# Each step has its own time limit; a failed or timed-out step is recorded (return code, seconds,
# the tail of its log) and the next one runs. OUT_DIR overrides the output folder.
set -uo pipefail

DRY_RUN=0
ONLY=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dry-run) DRY_RUN=1; shift ;;
    --only) ONLY="${2:-}"; shift 2 ;;
    *) echo "usage: bash benchmarks/gpu_check.sh [--dry-run] [--only STEP[,STEP...]]" >&2; exit 2 ;;
  esac
done

cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
OUT="${OUT_DIR:-results/gpu_check}"
PY="${PYTHON:-python}"

# name | time limit (s) | command; each writes its JSON into $OUT
STEPS=(
  "smoke_cuda|150|$PY benchmarks/smoke_cuda.py --out $OUT/smoke_cuda --timeout 140"
  "gpu_mfu|130|$PY benchmarks/gpu_mfu.py --presets config/gpu-small.yaml,config/paper.yaml --precisions fp16_fairseq,bf16 --variants before,cqt_fft,after --micro-batches 4 --warmup 2 --json $OUT/gpu_mfu.json"
  "preflight_gpu-small_fp16_fairseq|40|$PY -m acoustic_mlm preflight --config config/gpu-small.yaml --device cuda --precision fp16_fairseq --out $OUT/preflight_gpu-small_fp16_fairseq"
  "preflight_paper_fp16_fairseq|50|$PY -m acoustic_mlm preflight --config config/paper.yaml --device cuda --precision fp16_fairseq --out $OUT/preflight_paper_fp16_fairseq"
  "train_throughput|35|$PY benchmarks/train_throughput.py --config config/gpu-small.yaml --device cuda --precision bf16 --accum-steps 1 --steps 3 --warmup 2 --repeats 2 --sequential --json $OUT/train_throughput.json"
  "relax_fp16|35|$PY benchmarks/relax_fp16.py --config config/paper.yaml --device cuda --batch-size 4 --qk-scales 1,256 --json $OUT/relax_fp16.json"
  "tokenize_throughput|38|$PY benchmarks/tokenize_throughput.py --device cuda --batch-sizes 1,4,16 --clips 24 --repeats 2 --threads 4 --json $OUT/tokenize_throughput.json"
  "data_throughput|30|$PY benchmarks/data_throughput.py --device cuda --encode-batch 16 --encode-repeats 3 --skip-decode --json $OUT/data_throughput.json"
)
# The limits add up to 508 s, so the whole check ends within 8.5 minutes even when every step timed out.
# Measured on an H200 at b88a247 (issue 34): preflight of gpu-small 36-38 s, tokenize 37 s; relax_fp16 did
# 3 of 4 scales in 25 s (now 2 scales). The rest is not yet measured on a GPU.

selected() {  # whether a step runs: every step, or those named by --only
  [[ -z $ONLY ]] && return 0
  [[ ",$ONLY," == *",$1,"* ]]
}

check() {  # parse every command's options and its config on CPU, without running any (one process)
  "$PY" - "$@" <<'EOF'
import importlib.util, shlex, sys
from acoustic_mlm import cli
from acoustic_mlm import config
failed = 0
for i, command in enumerate(sys.argv[1:]):
    argv = shlex.split(command)[1:]  # without the interpreter
    try:
        if argv[:2] == ["-m", "acoustic_mlm"]:
            args = cli.build_parser().parse_args(argv[2:])
        elif argv and argv[0].endswith(".py"):
            spec = importlib.util.spec_from_file_location(f"bench{i}", argv[0])
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module  # dataclasses look their module up here
            spec.loader.exec_module(module)
            args = module.parse_args(argv[1:])
        else:
            raise ValueError("not a package or benchmark command")
        for path in [getattr(args, "config", None), *(getattr(args, "presets", None) or "").split(",")]:
            if path:
                config.load(path)
    except (SystemExit, Exception) as exc:  # argparse exits on a bad option
        print(f"  FAILED the check ({type(exc).__name__}: {exc}): {command}", file=sys.stderr)
        failed = 1
sys.exit(failed)
EOF
}

if [[ $DRY_RUN == 1 ]]; then
  commands=()
  for step in "${STEPS[@]}"; do
    IFS='|' read -r name limit cmd <<<"$step"
    selected "$name" || continue
    echo "[$name, limit ${limit}s] $cmd"
    commands+=("$cmd")
  done
  check "${commands[@]}" || exit 1
  echo "dry run: ${#commands[@]} commands checked"
  exit 0
fi

if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu_check: torch sees no CUDA device; use --dry-run to check the commands on CPU" >&2
  exit 2
fi
mkdir -p "$OUT/logs"
START=$(date +%s)
: >"$OUT/steps.jsonl"
for step in "${STEPS[@]}"; do
  IFS='|' read -r name limit cmd <<<"$step"
  selected "$name" || continue
  echo "== $name (limit ${limit}s): $cmd" >&2
  t0=$(date +%s)
  # shellcheck disable=SC2086
  timeout "$limit" $cmd >"$OUT/logs/$name.log" 2>&1
  rc=$?
  t1=$(date +%s)
  echo "   rc $rc in $((t1 - t0)) s" >&2
  "$PY" - "$name" "$rc" "$((t1 - t0))" "$cmd" "$OUT/logs/$name.log" >>"$OUT/steps.jsonl" <<'EOF'
import json, sys
name, rc, seconds, cmd, log = sys.argv[1:]
tail = open(log, errors="replace").read()[-2000:]
print(json.dumps({"name": name, "rc": int(rc), "timed_out": int(rc) == 124, "seconds": int(seconds),
                  "command": cmd, "log_tail": tail}))
EOF
done
"$PY" - "$OUT" "$(( $(date +%s) - START ))" <<'EOF'
import json, sys
from pathlib import Path
import torch
out, total = Path(sys.argv[1]), int(sys.argv[2])
steps = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
for s in steps:  # attach each step's own JSON results
    found = sorted(out.glob(f"{s['name']}.json")) + sorted((out / s["name"]).glob("*.json"))
    s["results"] = {p.name: json.loads(p.read_text()) for p in found}
summary = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "total_seconds": total,
           "steps": steps}
tmp = out / ".gpu_check.json.tmp"
tmp.write_text(json.dumps(summary, indent=2) + "\n")
tmp.replace(out / "gpu_check.json")
print(f"gpu_check: {sum(s['rc'] == 0 for s in steps)} of {len(steps)} steps succeeded in {total} s "
      f"on {summary['device']}; results in {out / 'gpu_check.json'}")
EOF
