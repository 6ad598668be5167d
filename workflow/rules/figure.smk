# Every arm's metrics -> tidy loss curves -> the figure.


rule aggregate:
    input:
        expand("results/runs/{run}/metrics.csv", run=RUNS),
    output:
        "results/loss_curves.csv",
    params:
        cli=AMLM,
        config=CONFIGFILE,
        runs=config["runs"],
    log:
        "results/logs/aggregate.log",
    threads: 1
    conda:
        ENV
    shell:
        "{params.cli} aggregate --config {params.config} --runs-dir results/runs --out {output} > {log} 2>&1"


rule figure:
    input:
        "results/loss_curves.csv",
    output:
        expand("results/figures/acoustic_mlm_loss_codebook0.{ext}", ext=FIGURE_FORMATS),
    params:
        cli=AMLM,
        config=CONFIGFILE,
        figure=config["figure"],
        runs=config["runs"],
    log:
        "results/logs/figure.log",
    threads: 1
    conda:
        ENV
    shell:
        "{params.cli} figure --config {params.config} --curves {input} --out results/figures > {log} 2>&1"
