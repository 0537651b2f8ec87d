"""What wraps engines: replicas behind one engine interface, one engine over several hosts, and a
pod's ``jax.distributed`` environment. (The logical-axis sharding table the loaders and the
planner read sits below them, in ``jaxgen.layers.sharding``.)"""
