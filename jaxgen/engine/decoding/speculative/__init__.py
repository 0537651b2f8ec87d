"""Speculative decoding: proposers guess a sequence's next tokens, one engine step verifies
them (``verify_step.py``; draft positions sampled by ``verify_sampling.py``), and the tokens
the target model's sampling agrees with are kept."""
