# A sweep's runs -> the stability map table -> the LR-sensitivity figure and the verdicts
# (acoustic_mlm.report.stability_map; docs/stability.md). Used instead of figure.smk when the config has `sweep:`.


rule stability_map:
    input:
        metrics=expand("results/runs/{run}/metrics.csv", run=RUNS),
        summaries=expand("results/runs/{run}/summary.json", run=RUNS),
    output:
        report("results/stability_map.csv", caption="../report/stability_map.rst", category="2. Findings"),
    log:
        "results/logs/map.log",
    conda:
        ENV
    threads: 1
    params:
        cli=AMLM,
        config=CONFIGFILE,
        settings=settings_for("map"),
    shell:
        "{params.cli} map --config {params.config} --runs-dir results/runs --out {output} > {log} 2>&1"


rule map_figure:
    input:
        "results/stability_map.csv",
    output:
        png=report(
            "results/figures/lr_sensitivity.png",
            caption="../report/lr_sensitivity.rst",
            category="1. Figure",
        ),
        pdf="results/figures/lr_sensitivity.pdf",
        svg="results/figures/lr_sensitivity.svg",
    log:
        "results/logs/map_figure.log",
    conda:
        ENV
    threads: 1
    params:
        cli=AMLM,
        config=CONFIGFILE,
        settings=settings_for("map_figure"),
    shell:
        "{params.cli} map-figure --config {params.config} --map {input} --out results/figures > {log} 2>&1"


rule map_claims:
    input:
        "results/stability_map.csv",
    output:
        json="results/map_claims.json",
        md=report("results/map_claims.md", caption="../report/map_claims.rst", category="2. Findings"),
    log:
        "results/logs/map_claims.log",
    conda:
        ENV
    threads: 1
    params:
        cli=AMLM,
        config=CONFIGFILE,
        settings=settings_for("map_claims"),
    shell:
        "{params.cli} map-claims --config {params.config} --map {input} --out-json {output.json} "
        "--out-md {output.md} > {log} 2>&1"


rule decide:
    input:
        metrics=expand("results/runs/{run}/metrics.csv", run=RUNS),
        summaries=expand("results/runs/{run}/summary.json", run=RUNS),
        tokenizer="data/codes/tokenizer.json",
    output:
        runs="results/decisive/runs.csv",
        cells="results/decisive/cells.csv",
        json="results/decisive/decisive.json",
        md=report("results/decisive/decisive.md", caption="../report/decisive.rst", category="2. Findings"),
    log:
        "results/logs/decide.log",
    conda:
        ENV
    threads: 1
    params:
        cli=AMLM,
        config=CONFIGFILE,
        settings=settings_for("decide"),
    shell:
        "{params.cli} decide --config {params.config} --runs-dir results/runs --codes data/codes "
        "--out results/decisive > {log} 2>&1"
