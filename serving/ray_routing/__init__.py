"""Cache-aware routing across Ray Serve replicas.

A request whose prompt starts like one a replica served recently is sent to that replica, whose
prefix cache likely still holds the prompt's pages. The pieces, each in its own file:

- ``routing_text``: the text a request body's prompt starts with (chat messages, a completion
  prompt, TGI's ``inputs``), prefixed by the model it names.
- ``prefix_tree``: an approximate radix tree of the texts routed to each replica, with per-replica
  ownership and a least-recently-used bound (plain Python).
- ``prefix_policy``: the routing decision over that tree and the replicas' loads (plain Python).
- ``prefix_router``: the policy as Ray Serve's ``RequestRouter`` (``request_router_config``).
- ``replica_bridge``: the engine replica's side of a forwarded request (jaxgen's app run
  in-process on a buffered body).
- ``forwarding_ingress`` / ``ingress_deployment``: the HTTP ingress that reads each body, so the
  router sees the prompt, and calls the engine replicas through a ``DeploymentHandle``.
"""
