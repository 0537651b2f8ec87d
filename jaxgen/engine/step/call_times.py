"""Time the host spends in the runner's calls: ``CallTimes`` sums the wall and thread-CPU time of
``ModelRunner.dispatch`` (launching a step) and ``ModelRunner.fetch`` (waiting for its result)
when set as the runner's ``call_times``; ``benchmarks/host_step.py`` subtracts them from a
step's time to get the host's own share."""

from __future__ import annotations

import contextlib
import dataclasses
import time


@dataclasses.dataclass
class CallTimes:
    dispatch: float = 0.0
    wait: float = 0.0
    dispatch_cpu: float = 0.0
    wait_cpu: float = 0.0

    def reset(self) -> None:
        self.dispatch = self.wait = self.dispatch_cpu = self.wait_cpu = 0.0

    @contextlib.contextmanager
    def measure(self, name: str):
        """Adds the block's wall and thread-CPU seconds to ``name`` ("dispatch" or "wait")."""
        start, cpu = time.perf_counter(), time.thread_time()
        try:
            yield
        finally:
            setattr(self, name, getattr(self, name) + time.perf_counter() - start)
            cpu_name = f"{name}_cpu"
            setattr(self, cpu_name, getattr(self, cpu_name) + time.thread_time() - cpu)
