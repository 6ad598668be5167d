# Every arm's metrics -> tidy loss curves -> the figure.


rule aggregate:
    input:
        expand("results/runs/{run}/metrics.csv", run=RUNS),
    output:
        curves="results/loss_curves.csv",
        diagnostics="results/diagnostics.csv",
        finals="results/final_losses.json",  # each arm's final loss by role (DVC: dvc exp show's columns)
    log:
        "results/logs/aggregate.log",
    conda:
        ENV
    threads: 1
    params:
        cli=AMLM,
        config=CONFIGFILE,
        settings=settings_for("aggregate"),
    shell:
        "{params.cli} aggregate --config {params.config} --runs-dir results/runs --out {output.curves} "
        "--finals {output.finals} > {log} 2>&1"


rule figure:
    input:
        curves="results/loss_curves.csv",
        reference=REFERENCE,  # overlaid when figure.overlay_paper
    output:
        png=report(
            "results/figures/acoustic_mlm_loss_codebook0.png",
            caption="../report/figure.rst",
            category="1. Figure",
        ),
        pdf="results/figures/acoustic_mlm_loss_codebook0.pdf",
        svg="results/figures/acoustic_mlm_loss_codebook0.svg",
    log:
        "results/logs/figure.log",
    conda:
        ENV
    threads: 1
    params:
        cli=AMLM,
        config=CONFIGFILE,
        settings=settings_for("figure"),
    shell:
        "{params.cli} figure --config {params.config} --curves {input.curves} --reference {input.reference} "
        "--out results/figures > {log} 2>&1"


rule stability:
    input:
        curves="results/loss_curves.csv",
        diagnostics="results/diagnostics.csv",
    output:
        png=report(
            "results/figures/stability.png",
            caption="../report/stability.rst",
            category="1. Figure",
        ),
        pdf="results/figures/stability.pdf",
        svg="results/figures/stability.svg",
    log:
        "results/logs/stability.log",
    conda:
        ENV
    threads: 1
    params:
        cli=AMLM,
        config=CONFIGFILE,
        settings=settings_for("stability"),
    shell:
        "{params.cli} stability --config {params.config} --curves {input.curves} "
        "--diagnostics {input.diagnostics} --out results/figures > {log} 2>&1"


rule claims:
    input:
        curves="results/loss_curves.csv",
        diagnostics="results/diagnostics.csv",
        reference=REFERENCE,
    output:
        json="results/claims.json",
        md=report("results/claims.md", caption="../report/claims.rst", category="2. Findings"),
    log:
        "results/logs/claims.log",
    conda:
        ENV
    threads: 1
    params:
        cli=AMLM,
        config=CONFIGFILE,
        settings=settings_for("claims"),
    shell:
        "{params.cli} claims --config {params.config} --curves {input.curves} --reference {input.reference} "
        "--diagnostics {input.diagnostics} "
        "--out-json {output.json} --out-md {output.md} > {log} 2>&1"


# The headline in one flat file: each arm's final loss and each claim's verdict (DVC's metrics file).
rule metrics:
    input:
        finals="results/final_losses.json",
        claims="results/claims.json",
    output:
        "results/metrics.json",
    log:
        "results/logs/metrics.log",
    conda:
        ENV
    threads: 1
    params:
        cli=AMLM,
        config=CONFIGFILE,
    shell:
        "{params.cli} metrics --config {params.config} --finals {input.finals} --claims {input.claims} "
        "--out {output} > {log} 2>&1"


rule compare:
    input:
        curves="results/loss_curves.csv",
        reference=REFERENCE,
    output:
        report(
            "results/figures/paper_vs_reproduction.png",
            caption="../report/compare.rst",
            category="1. Figure",
        ),
    log:
        "results/logs/compare.log",
    conda:
        ENV
    threads: 1
    params:
        cli=AMLM,
        config=CONFIGFILE,
        settings=settings_for("compare"),
    shell:
        "{params.cli} compare --config {params.config} --curves {input.curves} --reference {input.reference} "
        "--out {output} > {log} 2>&1"
