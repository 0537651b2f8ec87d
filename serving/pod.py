"""``python -m serving.pod [jaxgen serve flags]``: the entry point of one pod of a multi-host model.

Each pod of a group (a LeaderWorkerSet replica, the hosts of a TPU slice) runs this with the
same flags. It reads which cluster it belongs to from the environment
(``jaxgen.parallel.distributed_env``: LeaderWorkerSet, TPU VM or explicit ``JAX_*`` variables)
and joins it with ``jax.distributed.initialize``; every process then builds the same engine over
all the group's chips (``--tensor-parallel-degree`` = the group's chips). Process 0 serves HTTP as
``jaxgen serve`` does, its engine wrapped in a ``LeaderEngine``; the others follow its steps
(``jaxgen.parallel.multihost``) and exit when it stops. Without such variables it is
``jaxgen serve``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from jaxgen.async_llm import AsyncLLM
from jaxgen.parallel.distributed_env import distributed_setup
from jaxgen.parallel.multihost import LeaderEngine, StepChannel, follow_leader
from serving.launch.cli import run_serve
from serving.model_loading import build_engine
from serving.settings.flags import add_serve_arguments, check_engine_knobs, settings_from_args

logger = logging.getLogger("serving")


def run_pod(args: argparse.Namespace, environ=None) -> int:
    """Joins the group named by the environment, then serves (process 0) or follows."""
    setup = distributed_setup(os.environ if environ is None else environ)
    if setup is None:
        return run_serve(args)
    settings = settings_from_args(args)
    check_engine_knobs(settings)
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    import jax  # after the settings are checked: a bad flag fails before joining

    if jax.config.jax_platforms == "cpu":  # CPU processes reduce over gloo (tests, no TPU)
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    logger.info(
        "process %d of %d (from %s variables), coordinator %s",
        setup.process_id,
        setup.num_processes,
        setup.source,
        setup.coordinator_address,
    )
    setup.initialize()
    channel = StepChannel()
    if not setup.is_leader:
        steps = follow_leader(build_engine(settings), channel)
        logger.info("the leader stopped after %d steps", steps)
        return 0
    leaders: list[LeaderEngine] = []

    def build(settings) -> AsyncLLM:
        leaders.append(LeaderEngine(build_engine(settings), channel))
        return AsyncLLM(engine=leaders[-1])

    try:
        return run_serve(args, build=build)
    finally:
        for leader in leaders:  # the followers stop once the server has drained
            leader.shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m serving.pod", description=__doc__)
    add_serve_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run_pod(args)
    except (ValueError, FileNotFoundError) as error:
        print(f"serving.pod: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
