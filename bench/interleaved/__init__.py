"""Benchmarks that compare two builds or settings of jetlake in interleaved rounds, each round against
the real JetStream of the same run."""
