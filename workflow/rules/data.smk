# Audio in, EnCodec codes out: fetch -> prepare -> tokenize.


# data/downloads/ (kept archives, reused by hash) is deliberately not an output: Snakemake
# would delete it before each fetch. A `folder` source lies outside the DAG: after changing its
# contents, rerun with --forcerun fetch.
rule fetch:
    output:
        directory("data/raw"),
    params:
        cli=AMLM,
        config=CONFIGFILE,
        data=config["data"],
    log:
        "results/logs/fetch.log",
    threads: 1
    conda:
        ENV
    shell:
        "{params.cli} fetch --config {params.config} --out {output} > {log} 2>&1"


rule prepare:
    input:
        "data/raw",
    output:
        directory("data/prepared"),
    params:
        cli=AMLM,
        config=CONFIGFILE,
        data=config["data"],
        crop=config["train"]["crop_seconds"],  # clips shorter than one crop are rejected
    log:
        "results/logs/prepare.log",
    threads: 1
    conda:
        ENV
    shell:
        "{params.cli} prepare --config {params.config} --threads {threads} --raw {input} --out {output} > {log} 2>&1"


rule tokenize:
    input:
        "data/prepared",
    output:
        directory("data/codes"),
    params:
        cli=AMLM,
        config=CONFIGFILE,
        tokenizer=config["tokenizer"],
    log:
        "results/logs/tokenize.log",
    threads: 2
    conda:
        ENV
    shell:
        "{params.cli} tokenize --config {params.config} --threads {threads} --prepared {input} --out {output} > {log} 2>&1"
