# The pipeline: fetch, prepare, tokenize, train, and the figure (or, with a `sweep:` section, the
# stability map). Included by the Snakefile unless the --configfile declares a round of experiments;
# PIPELINE_TARGETS are the Snakefile's `all` (an included file's `default_target` is not the default).


include: "common.smk"


# Light jobs stay on the submit host under a cluster executor (downloads need its network).
localrules:
    all,
    fetch,
    plan,
    prepare,
    tokenize,
    status,


include: "data.smk"
include: "train.smk"
include: "preflight.smk"
include: "status.smk"


# With a `sweep:` section the runs are its points and the results are the stability map
# (map.smk); without one, the figure of the arms and its claims (figure.smk).
if SWEEP:

    include: "map.smk"

    localrules:
        stability_map,
        map_figure,
        map_claims,
        decide,

    PIPELINE_TARGETS = [
        "results/stability_map.csv",
        "results/decisive/decisive.json",
        *expand("results/figures/lr_sensitivity.{ext}", ext=FIGURE_FORMATS),
        "results/map_claims.json",
        "results/map_claims.md",
    ]

else:

    include: "figure.smk"

    localrules:
        aggregate,
        figure,
        stability,
        claims,
        metrics,
        compare,

    PIPELINE_TARGETS = [
        "results/loss_curves.csv",
        *expand("results/figures/acoustic_mlm_loss_codebook0.{ext}", ext=FIGURE_FORMATS),
        "results/figures/paper_vs_reproduction.png",
        *expand("results/figures/stability.{ext}", ext=FIGURE_FORMATS),
        "results/diagnostics.csv",
        "results/claims.json",
        "results/claims.md",
        "results/metrics.json",
    ]
