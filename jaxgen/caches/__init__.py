"""What jaxgen keeps on disk between runs, under one cache root (``compile_cache.cache_root``):
XLA's persistent compilation cache (``compile_cache``), arrays made from a file once and
mapped back (``array_cache``: packed CPU weights, GGUF dequantisations, tokenizer tables), and
the atomic write they all use (``atomic_file``)."""
