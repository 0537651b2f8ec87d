"""Processes the device check starts: each prints into the check's log line by line under a
prefix, and is killed (its own process group, nothing else) when its time is up."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

# Environment of every child: the GPU shared with the parent (no preallocation, a larger
# share for the child, which holds the 8B model while the parent waits), no downloads.
CHILD_ENV = {
    "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
    "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.9",
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "TQDM_DISABLE": "1",
    "PYTHONUNBUFFERED": "1",
}
KILL_GRACE_S = 5.0


class Child:
    """A started process whose output is echoed with ``[prefix]`` before each line."""

    def __init__(self, command: list[str], prefix: str):
        self.command = command
        self.started = time.time()
        self.process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            env={**os.environ, **CHILD_ENV},
            start_new_session=True,  # its own process group: killed alone, children included
        )
        self.tail: list[str] = []
        self.reader = threading.Thread(target=self._echo, args=(prefix,), daemon=True)
        self.reader.start()

    def _echo(self, prefix: str) -> None:
        for line in self.process.stdout:
            sys.stdout.write(f"[{prefix}] {line}")
            self.tail = (self.tail + [line.rstrip()])[-20:]
        sys.stdout.flush()

    def wait(self, deadline: float) -> int | None:
        """The exit code, or None after killing it at ``deadline`` (``time.time()``)."""
        try:
            code = self.process.wait(timeout=max(deadline - time.time(), 0.1))
        except subprocess.TimeoutExpired:
            self.kill()
            code = None
        self.reader.join(timeout=5)
        return code

    def kill(self) -> None:
        if self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    @property
    def seconds(self) -> float:
        return time.time() - self.started
