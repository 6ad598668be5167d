# Reproduce MERT's "Acoustic MLM Loss on Codebook-0 vs Training Steps" figure.
#   snakemake --cores all                                  offline CPU default (config/config.yaml)
#   snakemake --cores all --configfile config/smoke.yaml   the 3-minute smoke preset
#   snakemake --cores all --use-conda                      each job in workflow/envs/amlm.yaml
# Every rule is a thin call of the package's CLI (`python -m acoustic_mlm <stage>`).

from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"


# Light jobs stay on the submit host under a cluster executor (downloads need its network).
localrules:
    all,
    fetch,
    plan,
    prepare,
    tokenize,
    aggregate,
    figure,
    stability,
    claims,
    compare,
    status,


include: "workflow/rules/data.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/figure.smk"
include: "workflow/rules/preflight.smk"
include: "workflow/rules/status.smk"


rule all:
    input:
        "results/loss_curves.csv",
        expand("results/figures/acoustic_mlm_loss_codebook0.{ext}", ext=FIGURE_FORMATS),
        "results/figures/paper_vs_reproduction.png",
        expand("results/figures/stability.{ext}", ext=FIGURE_FORMATS),
        "results/diagnostics.csv",
        "results/claims.json",
        "results/claims.md",
    default_target: True
