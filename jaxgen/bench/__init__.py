"""Benchmarks: offline throughput, latency/throughput sweeps, batching strategies, peer engines.

Run them with ``jaxgen bench {offline,sweep,compare,peers}`` (see ``docs/benchmarks.md``). This
package is the ``jaxgen bench`` command; the repository's development scripts are in
``benchmarks/``.
"""
