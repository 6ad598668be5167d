# `snakemake status --nolock --configfile FILE`: one line per arm and seed while the runs train
# (amlm status; reads results/runs/ only). Not part of `all`, no output: it runs whenever asked.
# --nolock: a running `snakemake` holds the working directory's lock; this rule changes nothing
# but its log, which holds the last table printed.


rule status:
    log:
        "results/logs/status.log",
    conda:
        ENV
    threads: 1
    params:
        cli=AMLM,
        config=CONFIGFILE,
    shell:
        "{params.cli} status --config {params.config} --runs-dir results/runs 2>&1 | tee {log}"
