"""Benchmarks of what the store costs: restarts, small files, syncs, compaction, damage checks."""
