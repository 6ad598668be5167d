# Reproduce MERT's "Acoustic MLM Loss on Codebook-0 vs Training Steps" figure.
#   snakemake --cores all                                  offline CPU default (config/config.yaml)
#   snakemake --cores all --configfile config/smoke.yaml   the smoke preset (times: BENCHMARKS.md)
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
    status,


include: "workflow/rules/data.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/preflight.smk"
include: "workflow/rules/status.smk"


# With a `sweep:` section the runs are its points and the results are the stability map
# (map.smk); without one, the figure of the arms and its claims (figure.smk).
if SWEEP:

    include: "workflow/rules/map.smk"

    localrules:
        stability_map,
        map_figure,
        map_claims,
        decide,

    rule all:
        input:
            "results/stability_map.csv",
            "results/decisive/decisive.json",
            expand("results/figures/lr_sensitivity.{ext}", ext=FIGURE_FORMATS),
            "results/map_claims.json",
            "results/map_claims.md",
        default_target: True

else:

    include: "workflow/rules/figure.smk"

    localrules:
        aggregate,
        figure,
        stability,
        claims,
        compare,

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
