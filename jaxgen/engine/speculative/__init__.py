"""Speculative decoding: proposers guess a sequence's next tokens, one engine step verifies
them (``verify.py``), and the tokens the target model agrees with are kept."""
