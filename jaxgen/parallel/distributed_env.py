"""Which ``jax.distributed`` cluster a pod belongs to, read from its environment.

One model over several hosts needs every process to call ``jax.distributed.initialize`` with the
same coordinator, the group's size and its own index. The orchestrators name those differently:

- explicit: ``JAX_COORDINATOR_ADDRESS`` (host:port), ``JAX_NUM_PROCESSES``, ``JAX_PROCESS_ID``;
- LeaderWorkerSet: ``LWS_LEADER_ADDRESS`` (the leader pod's DNS name), ``LWS_GROUP_SIZE``,
  ``LWS_WORKER_INDEX`` (0 is the leader), with the port from ``JAXGEN_COORDINATOR_PORT``;
- Cloud TPU VMs and GKE TPU node pools: ``TPU_WORKER_HOSTNAMES`` (comma-separated, worker 0
  first) and ``TPU_WORKER_ID``.

The first complete set in that order wins. A group of one process (or no variables) needs no
cluster: :func:`distributed_setup` returns None.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

# JAX's customary coordinator port on TPU VMs.
DEFAULT_COORDINATOR_PORT = 8476


@dataclasses.dataclass(frozen=True, kw_only=True)
class DistributedSetup:
    """The arguments of ``jax.distributed.initialize`` for this process, and where they came
    from (``"jax"``, ``"lws"`` or ``"tpu"``)."""

    coordinator_address: str
    num_processes: int
    process_id: int
    source: str

    @property
    def is_leader(self) -> bool:
        """Process 0: the one that serves HTTP."""
        return self.process_id == 0

    def initialize(self, *, timeout_s: int = 300) -> None:
        """Joins the cluster (``jax.distributed.initialize``); every process must call it."""
        import jax  # the mapping above is plain Python; only joining needs jax

        jax.distributed.initialize(
            self.coordinator_address,
            num_processes=self.num_processes,
            process_id=self.process_id,
            initialization_timeout=timeout_s,
        )


def _int(environ: Mapping[str, str], name: str, minimum: int) -> int:
    raw = environ[name]
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def _port(environ: Mapping[str, str]) -> int:
    if "JAXGEN_COORDINATOR_PORT" not in environ:
        return DEFAULT_COORDINATOR_PORT
    port = _int(environ, "JAXGEN_COORDINATOR_PORT", 1)
    if port > 65535:
        raise ValueError(f"JAXGEN_COORDINATOR_PORT must be <= 65535, got {port}")
    return port


def _with_port(host: str, environ: Mapping[str, str], name: str) -> str:
    host = host.strip()
    if not host:
        raise ValueError(f"{name} is empty")
    if any(c.isspace() for c in host):  # e.g. libtpu's "WARNING: could not determine ..."
        raise ValueError(f"{name} is not a host name: {host[:60]!r}")
    if host.rsplit(":", 1)[-1].isdigit() and ":" in host:
        return host  # already host:port
    return f"{host}:{_port(environ)}"


def _checked(setup: DistributedSetup, index_name: str) -> DistributedSetup | None:
    if setup.process_id >= setup.num_processes:
        raise ValueError(
            f"{index_name}={setup.process_id} is outside a group of {setup.num_processes}"
        )
    return setup if setup.num_processes > 1 else None


def distributed_setup(environ: Mapping[str, str]) -> DistributedSetup | None:
    """The cluster this process joins, from ``environ``; None for a single process.

    Raises:
        ValueError: a variable that is not a number, an index outside the group, or a partial
            set (e.g. ``LWS_GROUP_SIZE`` without ``LWS_LEADER_ADDRESS``), naming the variable.
    """
    jax_names = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")
    lws_names = ("LWS_LEADER_ADDRESS", "LWS_GROUP_SIZE", "LWS_WORKER_INDEX")
    tpu_names = ("TPU_WORKER_HOSTNAMES", "TPU_WORKER_ID")
    for names in (jax_names, lws_names, tpu_names):
        present = [name for name in names if name in environ]
        if present and len(present) < len(names):
            missing = ", ".join(name for name in names if name not in environ)
            raise ValueError(f"{', '.join(present)} set without {missing}")
    for (address, size, index), source in ((jax_names, "jax"), (lws_names, "lws")):
        if address in environ:
            setup = DistributedSetup(
                coordinator_address=_with_port(environ[address], environ, address),
                num_processes=_int(environ, size, 1),
                process_id=_int(environ, index, 0),
                source=source,
            )
            return _checked(setup, index)
    if "TPU_WORKER_HOSTNAMES" in environ:
        hosts = [h for h in environ["TPU_WORKER_HOSTNAMES"].split(",") if h.strip()]
        if not hosts:
            raise ValueError("TPU_WORKER_HOSTNAMES is empty")
        setup = DistributedSetup(
            coordinator_address=_with_port(hosts[0], environ, "TPU_WORKER_HOSTNAMES"),
            num_processes=len(hosts),
            process_id=_int(environ, "TPU_WORKER_ID", 0),
            source="tpu",
        )
        return _checked(setup, "TPU_WORKER_ID")
    return None
