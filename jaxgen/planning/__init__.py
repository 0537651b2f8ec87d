"""Planning tools (``jaxgen plan``): KV capacity, one hardware datasheet, the TP sweep, and
the decode step compiled ahead of time for a TPU slice."""
