# `snakemake status --nolock --configfile FILE`: one line per arm and seed while the runs train
# (amlm status; reads results/runs/ only). Not part of `all`, no output: it runs whenever asked.
# --nolock: a running `snakemake` holds the working directory's lock, and this rule writes nothing.


rule status:
    params:
        cli=AMLM,
        config=CONFIGFILE,
    conda:
        ENV
    shell:
        "{params.cli} status --config {params.config} --runs-dir results/runs"
