# The workflow's rules are in workflow/Snakefile (the Snakemake workflow catalog's layout); this
# file only includes it, so that `snakemake` from the repository root finds a Snakefile and
# profiles/default/ beside it. Run from the root:
#   snakemake --cores all                                  offline CPU default (config/config.yaml)
#   snakemake --cores all --configfile config/smoke.yaml   the smoke preset (times: BENCHMARKS.md)
#   snakemake --report results/report.html                  the report of the last run (docs/tutorial.md)


include: "workflow/Snakefile"
