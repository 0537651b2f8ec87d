"""The model <-> kernel contract: the step's attention metadata and the one attention entry
point, the linear layer and its one matmul entry point, rotary embeddings. Models and
backends import these; these import neither."""
