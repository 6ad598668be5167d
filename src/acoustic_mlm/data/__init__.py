"""Getting audio: sources and their records, archives checked member by member, downloads, the
synthetic corpus, and the prepare stage (resampling, splits, shards)."""
