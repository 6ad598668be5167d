"""The files one stage writes and a later stage reads, one module per artifact: each holds the
artifact's file names, its columns or keys, its writer and its checked reader, and every stage
writes and reads the artifact through it.

    prepared      data/prepared/: shards.csv, shard-<k>/ (audio.npy, clips.csv, rejects.csv,
                  shard.json), manifest.csv (written last), rejects.csv, prepare.json
    codes         data/codes/: model/fit.json, shard-<k>/ (codes.npy, encode.json, loudness.csv),
                  files.csv, tokenizer.json (written last)
    metrics       a run's metrics.csv (a seed's, an arm's with a `seed` column) and a training
                  seed's metrics.partial.csv: the columns, the loss-column pattern
    run_summary   a run's summary.json (a seed's, an arm's): its keys and statuses
    reference_run a reference run (amlm verify --record): reference.json and every arm's metrics.csv
    checked       the checked reading each reader builds on (read_json, read_csv_table) and the one-line
                  ReadError naming the file, what is wrong and the stage to rerun

Standard library, numpy and pandas only (no torch): the stages that only read an artifact (the
reports, `amlm status`) import no model code, and a training stage depends on the corpus's and
the codes' formats, not on the stages that wrote them. This file is the package's docstring only:
importing one artifact's module imports no other (the DVC stages' module dependencies, dvcgen).
"""
