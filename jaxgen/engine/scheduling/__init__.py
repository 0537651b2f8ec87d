"""Requests and sequences, the scheduler and its policy (fcfs / priority), the page allocator, the batching modes, the KV pool's size, multi-step decoding: plain Python, no jax."""
