"""One engine over several processes: process 0 takes requests, the others repeat its steps.

After ``jax.distributed.initialize`` every process builds the same engine (same model, same
config), so the mesh spans all of their devices and each jitted step is one SPMD program whose
collectives cross hosts. SPMD needs every process to run the same steps on the same inputs. The
engine is deterministic given the requests it was given between steps (its scheduler is plain
Python; unseeded rows draw from ``config.seed``), so process 0 only has to tell the others which
requests were added or aborted before each step:

- :class:`LeaderEngine` wraps process 0's engine (``AsyncLLM(engine=LeaderEngine(engine))``, the
  HTTP server's engine). It records each accepted ``add_request`` and ``abort``, and publishes
  them, with a step number, before each ``step()``.
- :func:`follow_leader` runs on every other process: it applies each step's commands to its own
  engine and steps it, until the leader publishes a stop.

The commands travel through the ``jax.distributed`` coordination service's key-value store
(:class:`StepChannel`), which every process already talks to: no other port is opened.
"""

from __future__ import annotations

import pickle
import time

from jaxgen.engine.engine_interface import Engine
from jaxgen.engine.scheduling.new_request import NewRequest, takes_request_fields
from jaxgen.outputs import RequestOutput

_STOP = ("stop",)
# Step keys older than this are deleted by the leader (followers are at most one step behind:
# each step's collectives wait for every process).
_KEPT_STEPS = 16


class StepChannel:
    """Each step's commands, published by process 0 and read by the others in order."""

    def __init__(self, client=None, *, prefix: str = "jaxgen/steps"):
        if client is None:
            from jax._src.distributed import global_state  # the client jax.distributed made

            client = global_state.client
            if client is None:
                raise ValueError("StepChannel needs jax.distributed.initialize to run first")
        self.client = client
        self.prefix = prefix

    def publish(self, index: int, commands: list) -> None:
        self.client.key_value_set_bytes(f"{self.prefix}/{index}", pickle.dumps(commands))
        if index >= _KEPT_STEPS:
            self.client.key_value_delete(f"{self.prefix}/{index - _KEPT_STEPS}")

    def receive(self, index: int, timeout_s: float) -> list | None:
        """Step ``index``'s commands, or None when the leader published none within the timeout
        (an idle server)."""
        try:
            payload = self.client.blocking_key_value_get_bytes(
                f"{self.prefix}/{index}", int(timeout_s * 1000)
            )
        except Exception as error:  # the store reports a timeout as an error
            if "DEADLINE_EXCEEDED" in str(error) or "timed out" in str(error).lower():
                return None
            raise
        return pickle.loads(payload)


class LeaderEngine(Engine):
    """Process 0's engine: the usual engine interface, publishing every step's commands.

    ``add_request``, ``abort``, ``step`` and ``shutdown`` publish; every other member is the
    wrapped engine's.
    """

    def __init__(self, engine: Engine, channel: StepChannel):
        if getattr(engine.config, "batching", None) == "dynamic":
            raise ValueError(
                "batching='dynamic' waits on the clock, which differs between hosts; "
                "use continuous or static batching across processes"
            )
        self.engine = engine
        self.channel = channel
        self.pending: list[tuple] = []
        self.steps_published = 0
        self.stopped = False

    # -- the wrapped engine's members ------------------------------------------------------------
    @property
    def loaded(self):
        return self.engine.loaded

    @property
    def config(self):
        return self.engine.config

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    @property
    def num_steps(self) -> int:
        return self.engine.num_steps

    @property
    def last_batch_size(self) -> int:
        return self.engine.last_batch_size

    @property
    def batching(self):
        return self.engine.batching

    @property
    def requests(self):
        return self.engine.requests

    @property
    def params(self):
        return self.engine.params

    def has_unfinished(self) -> bool:
        return self.engine.has_unfinished()

    def precompile(self, sampling_params=None) -> int:
        return self.engine.precompile(sampling_params)

    def stats(self) -> dict:
        return self.engine.stats()

    def reset_prefix_cache(self) -> None:
        self.engine.reset_prefix_cache()

    def is_sleeping(self) -> bool:
        return self.engine.is_sleeping()

    # -- refused: the followers' weights and memory are their own --------------------------------
    def update_weights(self, params) -> None:
        raise ValueError("update_weights is not supported across hosts")

    def sleep(self, level: int = 1) -> None:
        raise ValueError("sleep is not supported across hosts")

    def wake_up(self, tags: list[str] | None = None) -> None:
        raise ValueError("wake_up is not supported across hosts (nor is sleep)")

    # -- published to the followers -------------------------------------------------------------
    @takes_request_fields
    def add_request(self, new: NewRequest):
        """Queues the request here and, once accepted, on every follower (each compiles its
        constraint itself: a compiled grammar does not cross processes)."""
        if new.lora_request is not None:  # followers would run the base model: refused
            raise ValueError("lora_request is not supported across hosts")
        request = new.add_to(self.engine)
        # Only accepted requests: a refused one raised above on every process alike.
        command = (
            "add",
            new.request_id,
            new.prompt,
            list(new.prompt_token_ids),
            new.params,
            new.priority,
        )
        self.pending.append(command)
        return request

    def abort(self, request_id: str) -> RequestOutput | None:
        output = self.engine.abort(request_id)
        if output is not None:
            self.pending.append(("abort", request_id))
        return output

    def step(self) -> list[RequestOutput]:
        commands, self.pending = self.pending, []
        self.channel.publish(self.steps_published, commands)
        self.steps_published += 1
        return self.engine.step()

    def shutdown(self) -> None:
        """Tells the followers to stop (once), then shuts the engine down if it can."""
        if not self.stopped:
            self.stopped = True
            self.channel.publish(self.steps_published, [_STOP])
        self.engine.shutdown()


def follow_leader(engine, channel: StepChannel, *, poll_s: float = 60.0) -> int:
    """Repeats the leader's steps on this process's ``engine`` until it publishes a stop;
    returns the number of steps run. Blocks while the server is idle."""
    index = 0
    while True:
        commands = channel.receive(index, poll_s)
        if commands is None:
            continue
        if _STOP in commands:
            return index
        for command in commands:
            if command[0] == "add":
                _, request_id, prompt, token_ids, params, priority = command
                engine.add_request(
                    request_id,
                    prompt,
                    token_ids,
                    params,
                    arrival_time=time.monotonic(),
                    priority=priority,
                )
            elif command[0] == "abort":
                engine.abort(command[1])
        engine.step()  # the same step as the leader's: same requests, same schedule
        index += 1
