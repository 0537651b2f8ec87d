"""``JaxgenIngress``: the Ray Serve deployment that takes HTTP for prefix-aware routing.

Ray's HTTP proxy hands an ingress replica the connection's ASGI scope only (the body follows on
callbacks), so a router placing those calls cannot see the prompt. This deployment is the
application's HTTP ingress instead: it reads the body and calls the engine deployment's
``forward`` through a ``DeploymentHandle``, whose calls carry a ``ForwardedRequest`` with the
prompt, so the engine deployment's request router (``PrefixRouter``) can place them. It holds no
model and imports neither jaxgen nor the server app.
"""

from __future__ import annotations

from ray import serve
from ray.exceptions import RayActorError
from ray.serve.handle import DeploymentHandle

from serving.ray_routing.forwarding_ingress import ForwardingIngress
from serving.ray_routing.replica_bridge import ForwardedRequest

INGRESS_NAME = "jaxgen-ingress"


@serve.ingress()
class JaxgenIngress:
    """One ingress replica: forwards every HTTP request to an engine replica.

    Args:
        engine: the engine deployment's handle (Ray passes it for the bound deployment).
        max_body_bytes: the largest request body (the server's ``--max-body-bytes``).
        body_read_timeout: seconds a body may take to arrive (``--body-read-timeout``).
    """

    def __init__(self, engine: DeploymentHandle, max_body_bytes: int, body_read_timeout: float):
        streaming = engine.options(stream=True)

        def forward(request: ForwardedRequest):
            return streaming.forward.remote(request)

        self.forwarding = ForwardingIngress(
            forward,
            retriable=(RayActorError,),
            max_body_bytes=max_body_bytes,
            body_read_timeout=body_read_timeout,
        )

    def __serve_build_asgi_app__(self):
        return self.forwarding
