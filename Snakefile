# The workflow's rules are in workflow/Snakefile (the Snakemake workflow catalog's layout); this
# file includes it, so that `snakemake` from the repository root finds a Snakefile and
# profiles/default/ beside it. Run from the root:
#   snakemake --cores all                                  offline CPU default (config/config.yaml)
#   snakemake --cores all --configfile config/smoke.yaml   the smoke preset (times: BENCHMARKS.md)
#   snakemake --report results/report.html                 the report of the last run (docs/tutorial.md)


include: "workflow/Snakefile"


# An included file cannot set the default target (Snakemake restores the including file's), so the
# default here is workflow/Snakefile's `all`: the same files, whichever of the two Snakefiles runs.
rule default:
    default_target: True
    input:
        rules.all.input,


localrules:
    default,
