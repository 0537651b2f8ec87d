"""``jaxgen.parallel.distributed_env``: which ``jax.distributed`` cluster a pod joins, from its
environment."""

from __future__ import annotations

import pytest

from jaxgen.parallel.distributed_env import DEFAULT_COORDINATOR_PORT, distributed_setup


def test_no_variables_or_a_group_of_one_is_a_single_process():
    assert distributed_setup({}) is None
    assert distributed_setup({"HOME": "/root"}) is None
    single = {"LWS_LEADER_ADDRESS": "a", "LWS_GROUP_SIZE": "1", "LWS_WORKER_INDEX": "0"}
    assert distributed_setup(single) is None


def test_leader_worker_set_variables():
    setup = distributed_setup(
        {"LWS_LEADER_ADDRESS": "lws-0.lws", "LWS_GROUP_SIZE": "4", "LWS_WORKER_INDEX": "3"}
    )
    assert setup.coordinator_address == f"lws-0.lws:{DEFAULT_COORDINATOR_PORT}"
    assert (setup.num_processes, setup.process_id, setup.source) == (4, 3, "lws")
    assert not setup.is_leader
    port = {"JAXGEN_COORDINATOR_PORT": "1234"}
    leader = distributed_setup(
        {"LWS_LEADER_ADDRESS": "h", "LWS_GROUP_SIZE": "2", "LWS_WORKER_INDEX": "0", **port}
    )
    assert leader.coordinator_address == "h:1234" and leader.is_leader


def test_tpu_worker_variables():
    setup = distributed_setup({"TPU_WORKER_HOSTNAMES": "t-0,t-1,t-2,t-3", "TPU_WORKER_ID": "2"})
    assert setup.coordinator_address == f"t-0:{DEFAULT_COORDINATOR_PORT}"
    assert (setup.num_processes, setup.process_id, setup.source) == (4, 2, "tpu")


def test_explicit_jax_variables_win_over_the_orchestrators():
    environ = {
        "JAX_COORDINATOR_ADDRESS": "10.0.0.1:9000",
        "JAX_NUM_PROCESSES": "2",
        "JAX_PROCESS_ID": "1",
        "LWS_LEADER_ADDRESS": "lws-0",
        "LWS_GROUP_SIZE": "4",
        "LWS_WORKER_INDEX": "3",
        "TPU_WORKER_HOSTNAMES": "t-0,t-1",
        "TPU_WORKER_ID": "0",
    }
    setup = distributed_setup(environ)
    assert (setup.coordinator_address, setup.num_processes, setup.process_id) == (
        "10.0.0.1:9000",
        2,
        1,
    )
    assert setup.source == "jax"
    lws_over_tpu = {k: v for k, v in environ.items() if not k.startswith("JAX_")}
    assert distributed_setup(lws_over_tpu).source == "lws"


@pytest.mark.parametrize(
    "environ, message",
    [
        ({"LWS_LEADER_ADDRESS": "a", "LWS_GROUP_SIZE": "4"}, "without LWS_WORKER_INDEX"),
        ({"JAX_NUM_PROCESSES": "2"}, "without JAX_COORDINATOR_ADDRESS, JAX_PROCESS_ID"),
        (
            {"LWS_LEADER_ADDRESS": "a", "LWS_GROUP_SIZE": "four", "LWS_WORKER_INDEX": "0"},
            "LWS_GROUP_SIZE must be an integer",
        ),
        (
            {"LWS_LEADER_ADDRESS": "a", "LWS_GROUP_SIZE": "4", "LWS_WORKER_INDEX": "4"},
            "LWS_WORKER_INDEX=4 is outside a group of 4",
        ),
        (
            {"LWS_LEADER_ADDRESS": " ", "LWS_GROUP_SIZE": "4", "LWS_WORKER_INDEX": "0"},
            "LWS_LEADER_ADDRESS is empty",
        ),
        ({"TPU_WORKER_HOSTNAMES": ",", "TPU_WORKER_ID": "0"}, "TPU_WORKER_HOSTNAMES is empty"),
        (
            {"TPU_WORKER_HOSTNAMES": "WARNING: could not determine", "TPU_WORKER_ID": "0"},
            "TPU_WORKER_HOSTNAMES is not a host name",
        ),
        (
            {
                "LWS_LEADER_ADDRESS": "a",
                "LWS_GROUP_SIZE": "2",
                "LWS_WORKER_INDEX": "0",
                "JAXGEN_COORDINATOR_PORT": "70000",
            },
            "JAXGEN_COORDINATOR_PORT must be <= 65535",
        ),
        ({"JAX_COORDINATOR_ADDRESS": "a", "JAX_NUM_PROCESSES": "0", "JAX_PROCESS_ID": "0"},
         "JAX_NUM_PROCESSES must be >= 1"),
    ],
)  # fmt: skip
def test_bad_variables_are_value_errors_naming_them(environ, message):
    with pytest.raises(ValueError, match=message):
        distributed_setup(environ)
