"""The model <-> kernel contract: the step's attention metadata (``attention``), the linear layer
and its one matmul entry point (``linear``), rotary embeddings (``rope``), and the logical-axis
sharding table every weight is placed by (``sharding``). Models, loaders and backends import
these; these import none of them."""
