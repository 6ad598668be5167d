# One training job per arm (its seeds one after another); arms share data and differ only in runs.<run>.
# Per-seed checkpoints land in results/runs/{run}/seeds/ and resumable state in results/runs/{run}/state/:
# neither is a declared output, so Snakemake never deletes them when a killed job is rerun.


rule train:
    input:
        manifest="data/prepared/manifest.csv",  # marks the prepared shards complete
        codes="data/codes/tokenizer.json",  # marks the code shards complete
    output:
        metrics=report(
            "results/runs/{run}/metrics.csv",
            caption="../report/metrics.rst",
            category="3. Runs",
            subcategory="{run}",
        ),
        summary="results/runs/{run}/summary.json",
    log:
        "results/logs/train/{run}.log",
    conda:
        ENV
    threads: config["train"]["threads"]
    resources:
        **TRAIN_SLURM,
        gpu=GPUS if USE_GPU else 0,
    params:
        cli=TRAIN_CLI,
        config=CONFIGFILE,
        settings=lambda wildcards: settings_for("train", wildcards.run),
        out=lambda wildcards: f"results/runs/{wildcards.run}",
    shell:
        "{params.cli} train {wildcards.run} --config {params.config} --threads {threads} "
        "--prepared data/prepared --codes data/codes --out {params.out} > {log} 2>&1"
