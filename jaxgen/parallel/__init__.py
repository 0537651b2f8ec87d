"""Parallelism: the logical-axis sharding table, replicas behind one engine interface,
one engine over several hosts, and a pod's ``jax.distributed`` environment."""
