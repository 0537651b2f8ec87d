"""docs/examples/rl_grpo.py, the RL example of docs/rl.md, runs as a user runs it: a few GRPO
iterations of a tiny random model on the CPU, whose rollouts (same seed each time) change with
the weights and whose reward climbs, while the live device memory stays flat and nothing
compiles after the first iteration."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "docs" / "examples" / "rl_grpo.py"


def test_the_rl_example_changes_rollouts_with_flat_memory():
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(SCRIPT.parents[2])}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--iterations", "3", "--json"],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    report = json.loads(lines[-1])
    assert [line.split(":")[0] for line in lines[:-1]] == [f"iteration {i}" for i in range(3)]
    rollouts = report["rollouts"]
    assert rollouts[0] != rollouts[1] != rollouts[2]  # one seed: the weights changed them
    assert report["rewards"][-1] > report["rewards"][0]
    # No weights left behind by an update (the first iteration makes a few small buffers).
    assert len(set(report["awake_bytes"][1:])) == 1
    assert all(a < b for a, b in zip(report["asleep_bytes"], report["awake_bytes"], strict=True))
    assert len(set(report["compiles"])) == 1  # updates and wake-ups compile nothing
