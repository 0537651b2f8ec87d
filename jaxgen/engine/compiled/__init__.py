"""Compiled executables: the on-disk executable store, compile contexts and counting, precompiling, the shape buckets."""
