# `snakemake preflight --configfile FILE`: measure every arm of the preset on this machine's device
# before the real run (time per update, memory, the figure's wall time and GPU-hours, disk).
# Not part of `all`; it needs the preset's device (train.device), so it is not a local rule.


rule preflight:
    output:
        json="results/preflight.json",
        md="results/preflight.md",
    log:
        "results/logs/preflight.log",
    conda:
        ENV
    threads: config["train"]["threads"]
    resources:
        gpu=1 if USE_GPU else 0,
    params:
        cli=AMLM,
        config=CONFIGFILE,
        # what its numbers depend on: the model, training and arms, the corpus size and the codes' bandwidth
        settings={key: config[key] for key in ("data", "tokenizer", "model", "train", "runs")},
    shell:
        "{params.cli} preflight --config {params.config} --threads {threads} --out results > {log} 2>&1"
