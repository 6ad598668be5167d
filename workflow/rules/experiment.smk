# A round of experiments (config/experiments/<round>.yaml) as a Snakemake workflow: one job a planned
# run, each a thin call of `amlm experiment run --only` that trains the run unless the round's tables
# hold it (a published run is never trained again) and appends its record, then marks its job done;
# the verdicts by `amlm experiment judge` once every run is in. Killed, it resumes: a run in the
# tables is not trained again, a run cut midway starts over.
#   snakemake --cores all --configfile config/experiments/example.yaml
import os
import re
import sys
from pathlib import Path

ROOT = Path(workflow.basedir) if (Path(workflow.basedir) / "src").is_dir() else Path(workflow.basedir).parent
sys.path.insert(0, str(ROOT / "src"))
from acoustic_mlm.errors import UserError as _UserError
from acoustic_mlm.experiments import declaration as amlm_round
from acoustic_mlm.experiments import judge as amlm_judge
from acoustic_mlm.experiments import runner as amlm_runner

try:
    ROUND = amlm_round.load(ROUND_FILE)
except _UserError as _exc:
    print(f"snakemake: invalid round: {_exc}", file=sys.stderr)
    sys.exit(2)
ROUND_OUT = f"results/experiments/{ROUND.name}"
ROUND_VERDICT = f"{ROUND_OUT}/{ROUND.verdict}"  # the round's target (the Snakefile's `all`)
ROUND_RUNS = {amlm_runner.run_name(*run): run for run in amlm_judge.plan(ROUND)}
AMLM = f'PYTHONPATH="{os.path.relpath(ROOT / "src")}" python -m acoustic_mlm'


wildcard_constraints:
    planned="|".join(re.escape(name) for name in ROUND_RUNS) or "no-run",


rule experiment_run:
    output:
        f"{ROUND_OUT}/done/{{planned}}",
    log:
        f"{ROUND_OUT}/logs/{{planned}}.log",
    conda:
        "../envs/amlm.yaml"
    threads: 1
    params:
        cli=AMLM,
        round=ROUND_FILE,
        only=lambda wildcards: amlm_runner.run_key(*ROUND_RUNS[wildcards.planned]),
    shell:
        "{params.cli} experiment run {params.round} --only {params.only} --done {output} " "> {log} 2>&1"


rule experiment_judge:
    input:
        expand(f"{ROUND_OUT}/done/{{planned}}", planned=list(ROUND_RUNS)),
    output:
        ROUND_VERDICT,
    log:
        f"{ROUND_OUT}/logs/judge.log",
    conda:
        "../envs/amlm.yaml"
    threads: 1
    params:
        cli=AMLM,
        round=ROUND_FILE,
        out=lambda wildcards, output: os.path.dirname(output[0]),
    shell:
        "{params.cli} experiment judge {params.round} --out {params.out} > {log} 2>&1"
