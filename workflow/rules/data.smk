# Audio in, EnCodec codes out: fetch -> plan -> prepare_shard (one job per shard) -> prepare
# -> fit_tokenizer -> tokenize_shard (one job per shard) -> tokenize.
# The shard count is known only once the audio is there, so `plan` is a checkpoint; the two
# merge rules (prepare, tokenize) list the shards from its shards.csv.


# data/downloads/ (kept archives, reused by hash) is deliberately not an output: Snakemake
# would delete it before each fetch. A `folder` source lies outside the DAG: after changing its
# contents, rerun with --forcerun fetch.
rule fetch:
    output:
        directory("data/raw"),
    log:
        "results/logs/fetch.log",
    conda:
        ENV
    threads: 1
    params:
        cli=AMLM,
        config=CONFIGFILE,
        settings=settings_for("fetch"),
    shell:
        "{params.cli} fetch --config {params.config} --out {output} > {log} 2>&1"


checkpoint plan:
    input:
        "data/raw",
    output:
        "data/prepared/shards.csv",
    log:
        "results/logs/prepare/plan.log",
    conda:
        ENV
    threads: 1
    params:
        cli=AMLM,
        config=CONFIGFILE,
        settings=settings_for("plan"),
    shell:
        "{params.cli} prepare --plan --config {params.config} --raw {input} --out data/prepared > {log} 2>&1"


rule prepare_shard:
    input:
        raw="data/raw",
        plan="data/prepared/shards.csv",
    output:
        directory("data/prepared/shard-{shard}"),
    log:
        "results/logs/prepare/shard-{shard}.log",
    conda:
        ENV
    threads: 1
    params:
        cli=AMLM,
        config=CONFIGFILE,
        k=lambda wildcards: int(wildcards.shard),
        settings=settings_for("prepare_shard"),
    shell:
        "{params.cli} prepare --shard {params.k} --config {params.config} --raw {input.raw} --out data/prepared "
        "> {log} 2>&1"


rule prepare:
    input:
        plan="data/prepared/shards.csv",
        shards=prepared_shards,
    output:
        manifest="data/prepared/manifest.csv",
        rejects=report("data/prepared/rejects.csv", caption="../report/rejects.rst", category="4. Data"),
        summary="data/prepared/prepare.json",
    log:
        "results/logs/prepare/merge.log",
    conda:
        ENV
    threads: 1
    params:
        cli=AMLM,
        config=CONFIGFILE,
        settings=settings_for("prepare_merge"),
    shell:
        "{params.cli} prepare --merge --config {params.config} --out data/prepared > {log} 2>&1"


# The pretrained EnCodec checkpoint is brought on the submit host (a local rule): under SLURM a compute node may
# have no network. Its record, data/codes/checkpoint.json, is an input of fit_tokenizer in pretrained mode.
localrules:
    encodec_checkpoint,


rule encodec_checkpoint:
    output:
        "data/codes/checkpoint.json",
    log:
        "results/logs/tokenize/checkpoint.log",
    conda:
        ENV
    threads: 1
    params:
        cli=AMLM,
        config=CONFIGFILE,
    shell:
        "{params.cli} tokenize --checkpoint-only --config {params.config} --out data/codes > {log} 2>&1"


rule fit_tokenizer:
    input:
        manifest="data/prepared/manifest.csv",
        shards=prepared_shards,
        checkpoint="data/codes/checkpoint.json" if config["tokenizer"]["mode"] == "pretrained" else [],
    output:
        directory("data/codes/model"),
    log:
        "results/logs/tokenize/fit.log",
    conda:
        ENV
    threads: config["tokenizer"]["threads"]  # fixed: the codes depend on it (acoustic_mlm.config tokenizer.threads)
    params:
        cli=AMLM,
        config=CONFIGFILE,
        settings=settings_for("tokenize_fit"),
    shell:
        "{params.cli} tokenize --fit --config {params.config} --threads {threads} --prepared data/prepared "
        "--out data/codes > {log} 2>&1"


rule tokenize_shard:
    input:
        manifest="data/prepared/manifest.csv",
        shard="data/prepared/shard-{shard}",
        model="data/codes/model",
    output:
        directory("data/codes/shard-{shard}"),
    log:
        "results/logs/tokenize/shard-{shard}.log",
    conda:
        ENV
    threads: config["tokenizer"]["threads"]  # fixed: the codes depend on it (acoustic_mlm.config tokenizer.threads)
    resources:
        gpu=1 if config["tokenizer"]["device"] == "cuda" else 0,
    params:
        cli=AMLM,
        config=CONFIGFILE,
        k=lambda wildcards: int(wildcards.shard),
        settings=settings_for("tokenize_shard"),
    shell:
        "{params.cli} tokenize --shard {params.k} --config {params.config} --threads {threads} "
        "--prepared data/prepared --out data/codes > {log} 2>&1"


rule tokenize:
    input:
        manifest="data/prepared/manifest.csv",
        model="data/codes/model",
        shards=code_shards,
    output:
        "data/codes/tokenizer.json",
    log:
        "results/logs/tokenize/merge.log",
    conda:
        ENV
    threads: 1
    params:
        cli=AMLM,
        config=CONFIGFILE,
        settings=settings_for("tokenize_merge"),
    shell:
        "{params.cli} tokenize --merge --config {params.config} --prepared data/prepared --out data/codes "
        "> {log} 2>&1"
