#!/usr/bin/env bash
# The GPU measurements in one prepared run: a machine with one GPU and PyTorch, under 8 minutes, results as JSON.
#
#   bash benchmarks/gpu_check.sh --make-wheelhouse  # where there is network: wheelhouse/ for the machine below
#   bash benchmarks/gpu_check.sh                    # on the GPU -> results/gpu_check/gpu_check.json
#   bash benchmarks/gpu_check.sh --only gpu_mfu     # one step (or several, comma-separated) of the list below
#   bash benchmarks/gpu_check.sh --dry-run          # print every command and check it on CPU (configs, options)
#   bash benchmarks/gpu_check.sh --cpu-rehearsal    # run every step's CPU form; the GPU-only ones are skipped
#
# Runs from the repository root and reads nothing outside the checkout: the smoke corpus is synthesized by
# the pipeline, the EnCodec checkpoint made by smoke_cuda.py, the benchmarks' inputs made by each script.
# The package is imported from src/ (PYTHONPATH=src), so an image whose torch is newer than the pin
# (issue 34: torch 2.11) keeps its torch. Its other dependencies come from wheelhouse/ (made by
# benchmarks/make_wheelhouse.py; docs/gpus.md): step 0 installs them with `pip install --no-index` into
# a virtual environment over the image's packages ($OUT/venv, --system-site-packages), which every later
# step runs in. The image must bring torch, torchaudio of the same build (encodec and the prepare stage
# import it), numpy, scipy, pandas and matplotlib (too large for the wheelhouse); step 0 names any that
# is missing and the steps that need it.
#   0. install: the wheelhouse into $OUT/venv, and which imports the steps need are there;
#   1. benchmarks/smoke_cuda.py: the smoke pipeline end to end on CUDA on gpu-small's data path (int16
#      prepared audio, pretrained-format EnCodec with a checkpoint it makes, fp16_fairseq), every arm,
#      one killed (SIGKILL) after its first resumable states and resumed by the rerun;
#   2. benchmarks/smoke_cuda.py --ddp-only: one arm trained by two DDP processes (torchrun) on step 1's
#      data: gloo on one GPU (AMLM_DIST_BACKEND=gloo), NCCL where two GPUs are present;
#   3. benchmarks/gpu_mfu.py: MFU of gpu-small and paper (one process's micro-batch) in fp16_fairseq
#      and bf16, before (nnAudio's CQT, cuDNN front end), with the FFT CQT, and after (FFT CQT, front
#      end as matmuls);
#   4-5. amlm preflight of gpu-small and of paper in their own fp16_fairseq (paper: 8 processes per
#      node on one GPU, so one process measured and the node projected);
#   6. benchmarks/train_throughput.py at gpu-small size: the four arms against nn.TransformerEncoder,
#      one model at a time;
#   7. benchmarks/relax_fp16.py: PB-Relax against plain attention in fp16 on the same inputs;
#   8. benchmarks/tokenize_throughput.py on the GPU at EnCodec batches 1, 4 and 16 (the encoder at the
#      GPU presets' batch of 16; synthetic clips made by the script).
# Each step has its own time limit; a failed or timed-out step is recorded (return code, seconds,
# the tail of its log) and the next one runs. OUT_DIR overrides the output folder.
set -uo pipefail

DRY_RUN=0
CPU_REHEARSAL=0
ONLY=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dry-run) DRY_RUN=1; shift ;;
    --cpu-rehearsal) CPU_REHEARSAL=1; shift ;;
    --only) ONLY="${2:-}"; shift 2 ;;
    --make-wheelhouse) shift; cd "$(dirname "$0")/.." && exec "${PYTHON:-python}" benchmarks/make_wheelhouse.py "$@" ;;
    *) echo "usage: bash benchmarks/gpu_check.sh [--dry-run | --cpu-rehearsal | --make-wheelhouse [ARGS]] [--only STEP[,STEP...]]" >&2; exit 2 ;;
  esac
done

cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
DEFAULT_OUT=results/gpu_check
[[ $CPU_REHEARSAL == 1 ]] && DEFAULT_OUT=results/gpu_check/cpu_rehearsal
OUT="${OUT_DIR:-$DEFAULT_OUT}"
[[ $OUT == /* ]] || OUT="$PWD/$OUT"
PY="${PYTHON:-python}"
WHEELHOUSE="${WHEELHOUSE:-wheelhouse}"

# name | time limit (s) | command on the GPU | its CPU form for --cpu-rehearsal ("-": GPU only, skipped)
STEPS=(
  "install|35|install_wheelhouse|install_wheelhouse"
  "smoke_cuda|120|\$PY benchmarks/smoke_cuda.py --out $OUT/smoke_cuda --timeout 110|\$PY benchmarks/smoke_cuda.py --out $OUT/smoke_cuda --device cpu --cores 2 --timeout 900"
  "ddp_two_processes|45|\$PY benchmarks/smoke_cuda.py --out $OUT/smoke_cuda --ddp-only --ddp-processes 2 --ddp-steps 30 --ddp-timeout 40|\$PY benchmarks/smoke_cuda.py --out $OUT/smoke_cuda --device cpu --ddp-only --ddp-processes 2 --ddp-steps 10 --ddp-timeout 300"
  "gpu_mfu|100|\$PY benchmarks/gpu_mfu.py --presets config/gpu-small.yaml,config/paper.yaml --precisions fp16_fairseq,bf16 --variants before,cqt_fft,after --micro-batches 4 --warmup 2 --json $OUT/gpu_mfu.json|\$PY benchmarks/gpu_mfu.py --presets config/smoke.yaml --precisions fp32 --cqt-loss-weight 1 --crop-seconds 0.4 --micro-batches 1 --warmup 1 --threads 1 --json $OUT/gpu_mfu.json"
  "preflight_gpu-small_fp16_fairseq|40|\$PY -m acoustic_mlm preflight --config config/gpu-small.yaml --device cuda --precision fp16_fairseq --out $OUT/preflight_gpu-small_fp16_fairseq|\$PY -m acoustic_mlm preflight --config config/smoke.yaml --device cpu --out $OUT/preflight_gpu-small_fp16_fairseq"
  "preflight_paper_fp16_fairseq|45|\$PY -m acoustic_mlm preflight --config config/paper.yaml --device cuda --precision fp16_fairseq --out $OUT/preflight_paper_fp16_fairseq|-"
  "train_throughput|25|\$PY benchmarks/train_throughput.py --config config/gpu-small.yaml --device cuda --precision bf16 --accum-steps 1 --steps 3 --warmup 2 --repeats 2 --sequential --json $OUT/train_throughput.json|\$PY benchmarks/train_throughput.py --config config/smoke.yaml --device cpu --precision fp32 --accum-steps 1 --steps 2 --warmup 1 --repeats 1 --sequential --json $OUT/train_throughput.json"
  "relax_fp16|25|\$PY benchmarks/relax_fp16.py --config config/paper.yaml --device cuda --batch-size 4 --qk-scales 1,256 --json $OUT/relax_fp16.json|\$PY benchmarks/relax_fp16.py --config config/smoke.yaml --device cpu --batch-size 2 --crop-seconds 0.4 --qk-scales 1,64 --threads 1 --json $OUT/relax_fp16.json"
  "tokenize_throughput|30|\$PY benchmarks/tokenize_throughput.py --device cuda --batch-sizes 1,4,16 --clips 16 --repeats 2 --threads 4 --json $OUT/tokenize_throughput.json|\$PY benchmarks/tokenize_throughput.py --device cpu --batch-sizes 1,4 --clips 4 --max-seconds 6 --repeats 1 --threads 2 --json $OUT/tokenize_throughput.json"
)
# The limits add up to 465 s, so the whole check ends within 8 minutes (480 s, with 15 s for starting the
# steps and writing their JSON) even when every step timed out. Measured on an H200 at b88a247 (issue 34):
# preflight of gpu-small 36-38 s, tokenize 37 s at 24 clips (now 16); relax_fp16 did 3 of 4 scales in
# 25 s (now 2 scales). The rest is not yet measured on a GPU.
# The CPU forms run with CPU_LIMIT seconds each (default 900): a CPU is slower and the rehearsal is not timed.

selected() {  # whether a step runs: every step, or those named by --only
  [[ -z $ONLY ]] && return 0
  [[ ",$ONLY," == *",$1,"* ]]
}

# What the steps import beyond torch (module:the steps known to need it; ddp_two_processes needs what made
# smoke_cuda's data), for the install step's report. The wheelhouse holds more (snakemake's own requirements).
NEEDS="torchaudio:smoke_cuda,ddp_two_processes,tokenize_throughput numpy:all scipy:all pandas:all
matplotlib:smoke_cuda encodec:smoke_cuda,ddp_two_processes,tokenize_throughput nnAudio:gpu_mfu jsonschema:all
yaml:all soundfile:smoke_cuda,tokenize_throughput snakemake:smoke_cuda seaborn:smoke_cuda
zipfile_deflate64:smoke_cuda filelock:smoke_cuda,ddp_two_processes tqdm:all"

install_wheelhouse() {  # step 0: the wheelhouse into $OUT/venv over the image's packages, then what imports
  if [[ -f $WHEELHOUSE/requirements.txt ]]; then
    "$PY" -m venv --system-site-packages "$OUT/venv" || return 1
    # the image's own site folders too (its Python may itself be a venv, whose packages a venv made from it
    # would not see), after the venv's: its wheels shadow the image's older versions
    "$PY" - "$OUT/venv" <<'EOF' || return 1
import site, sys
from pathlib import Path
folders = [p for p in sys.path if p.endswith(("site-packages", "dist-packages")) and Path(p).is_dir()]
(target,) = Path(sys.argv[1]).glob("lib/python*/site-packages")
(target / "zz_image.pth").write_text(f"import site; list(map(site.addsitedir, {folders!r}))\n")
EOF
    "$OUT/venv/bin/python" -m pip install -q --disable-pip-version-check --no-index --find-links "$WHEELHOUSE" \
      --no-deps --no-compile -r "$WHEELHOUSE/requirements.txt" || return 1
    echo "installed $(grep -c . "$WHEELHOUSE/requirements.txt") distributions from $WHEELHOUSE into $OUT/venv"
  else
    echo "no $WHEELHOUSE/requirements.txt (bash benchmarks/gpu_check.sh --make-wheelhouse): the image's packages as they are"
  fi
  local py="$PY"
  [[ -x $OUT/venv/bin/python ]] && py="$OUT/venv/bin/python"
  "$py" - "$NEEDS" "$OUT/imports.json" <<'EOF'
import importlib, json, sys
needs = [item.split(":") for item in sys.argv[1].split()]
missing = {}
for module, steps in needs:
    try:
        importlib.import_module(module)
    except Exception as exc:  # an ImportError, or a library that fails to load (torchaudio of another torch)
        missing[module] = {"steps": steps, "error": f"{type(exc).__name__}: {exc}"[:300]}
with open(sys.argv[2], "w") as f:
    json.dump({"python": sys.version.split()[0], "missing": missing}, f, indent=2)
for module, m in missing.items():
    print(f"missing {module} (needed by {m['steps']}): {m['error']}")
print(f"imports: {len(needs) - len(missing)} of {len(needs)} load")
sys.exit(1 if missing else 0)
EOF
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

command_of() {  # the step's command for this mode, with $PY as it stands now ("-": none)
  local cmd="$1"
  [[ $CPU_REHEARSAL == 1 ]] && cmd="$2"
  echo "${cmd//\$PY/$PY}"
}

if [[ $DRY_RUN == 1 ]]; then
  commands=()
  for step in "${STEPS[@]}"; do
    IFS='|' read -r name limit gpu_cmd cpu_cmd <<<"$step"
    selected "$name" || continue
    cmd=$(command_of "$gpu_cmd" "$cpu_cmd")
    echo "[$name, limit ${limit}s] $cmd"
    [[ $cmd == install_wheelhouse || $cmd == - ]] || commands+=("$cmd")
  done
  check "${commands[@]}" || exit 1
  echo "dry run: ${#commands[@]} commands checked"
  exit 0
fi

if [[ $CPU_REHEARSAL == 0 ]] && ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu_check: torch sees no CUDA device; use --dry-run or --cpu-rehearsal to check the commands on CPU" >&2
  exit 2
fi
mkdir -p "$OUT/logs"
START=$(date +%s)
: >"$OUT/steps.jsonl"
for step in "${STEPS[@]}"; do
  IFS='|' read -r name limit gpu_cmd cpu_cmd <<<"$step"
  selected "$name" || continue
  [[ $CPU_REHEARSAL == 1 ]] && limit="${CPU_LIMIT:-900}"
  cmd=$(command_of "$gpu_cmd" "$cpu_cmd")
  t0=$(date +%s)
  if [[ $cmd == - ]]; then
    echo "== $name: GPU only, skipped in the CPU rehearsal" >&2
    echo "GPU only: skipped in the CPU rehearsal" >"$OUT/logs/$name.log"
    rc=-1
  elif [[ $cmd == install_wheelhouse ]]; then
    echo "== $name (limit ${limit}s): $WHEELHOUSE into $OUT/venv" >&2
    export -f install_wheelhouse  # timeout runs a command: the function in a child bash
    export PY OUT WHEELHOUSE NEEDS
    timeout "$limit" bash -c install_wheelhouse >"$OUT/logs/$name.log" 2>&1
    rc=$?
    [[ -x $OUT/venv/bin/python ]] && PY="$OUT/venv/bin/python"  # every later step runs in the venv
  else
    echo "== $name (limit ${limit}s): $cmd" >&2
    # shellcheck disable=SC2086
    timeout "$limit" $cmd >"$OUT/logs/$name.log" 2>&1
    rc=$?
  fi
  t1=$(date +%s)
  echo "   rc $rc in $((t1 - t0)) s" >&2
  "$PY" - "$name" "$rc" "$((t1 - t0))" "$cmd" "$OUT/logs/$name.log" >>"$OUT/steps.jsonl" <<'EOF'
import json, sys
name, rc, seconds, cmd, log = sys.argv[1:]
tail = open(log, errors="replace").read()[-2000:]
print(json.dumps({"name": name, "rc": int(rc), "skipped": int(rc) == -1, "timed_out": int(rc) == 124,
                  "seconds": int(seconds), "command": cmd, "log_tail": tail}))
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
    if s["name"] == "install":
        found = sorted(out.glob("imports.json"))
    elif s["name"].startswith("ddp"):
        found = sorted((out / "smoke_cuda").glob("ddp.json"))
    elif s["name"] == "smoke_cuda":
        found = sorted((out / "smoke_cuda").glob("smoke_cuda.json"))
    s["results"] = {p.name: json.loads(p.read_text()) for p in found}
device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu (rehearsal)"
summary = {"device": device, "torch": torch.__version__, "total_seconds": total, "steps": steps}
tmp = out / ".gpu_check.json.tmp"
tmp.write_text(json.dumps(summary, indent=2) + "\n")
tmp.replace(out / "gpu_check.json")
ran = [s for s in steps if not s["skipped"]]
print(f"gpu_check: {sum(s['rc'] == 0 for s in ran)} of {len(ran)} steps succeeded ({len(steps) - len(ran)} "
      f"skipped) in {total} s on {device}; results in {out / 'gpu_check.json'}")
EOF
