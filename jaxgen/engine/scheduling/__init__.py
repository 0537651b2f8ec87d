"""Requests and sequences, the scheduler, the page allocator, the batching modes, the KV pool's size, multi-step decoding: plain Python, no jax."""
