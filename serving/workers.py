"""The threads that prepare a request off the event loop: parsing its body, rendering and
tokenising its prompt, compiling its output constraint; and the thread that builds a large
answer (token strings, logprobs, its JSON).

The event loop only reads bodies and writes responses; a 4 MB prompt, a thousand-rule grammar
or a 10 MB answer never stalls ``/health`` or another client's stream. Each kind of work has a
lane for small jobs and one for large ones, so a plain request never waits behind a hostile one:

- parsing: bodies up to ``LARGE_BODY_BYTES`` on one thread, larger ones on another;
- answering: answers covering up to ``SMALL_ANSWER_TOKENS`` tokens are built on the event loop
  (a thread's round trip would cost more), larger ones on the format thread;
- compiling: constraints up to ``SMALL_CONSTRAINT_BYTES`` (as JSON) on one thread, larger ones
  on ``grammar_compile_workers`` threads. Both compile lanes have a large native stack
  (``GrammarThreads``) and hold at most ``max_queued_grammar_compiles`` compiles, running or
  waiting; past that a request gets 429 at once.

A request whose client disconnects is cancelled where it waits (``run_until_disconnect``); a
compile already running finishes, and its grammar is cached for the next request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from jaxgen.engine.structured.grammar_threads import GrammarThreads

LARGE_BODY_BYTES = 16 << 10  # bodies past this are parsed on the large lane
SMALL_CONSTRAINT_BYTES = 4 << 10  # constraints up to this compile on the small lane
SMALL_ANSWER_TOKENS = 256  # answers covering more tokens are built on the format lane


class Workers:
    """The server's preparation threads (see the module docstring)."""

    def __init__(
        self, grammar_compile_workers: int, max_queued_grammar_compiles: int, admitted: int = 0
    ):
        """``admitted``: requests in flight at most (``--max-concurrent-requests``): the small
        lane (constraints of a few KiB, compiled in milliseconds) queues that many, so benign
        schemas wait their turn rather than get 429 while the threads are busy."""
        self.parse_small = ThreadPoolExecutor(1, thread_name_prefix="jaxgen-parse")
        self.parse_large = ThreadPoolExecutor(1, thread_name_prefix="jaxgen-parse-large")
        self.format = ThreadPoolExecutor(1, thread_name_prefix="jaxgen-format")
        self.compile_small = GrammarThreads(
            1, max_pending=max(max_queued_grammar_compiles, admitted), name="grammar-small"
        )
        self.compile_large = GrammarThreads(
            grammar_compile_workers, max_pending=max_queued_grammar_compiles, name="grammar"
        )

    async def parse(self, size: int, fn: Callable, *args):
        """``fn(*args)`` on the parse lane for a body of ``size`` bytes."""
        lane = self.parse_large if size > LARGE_BODY_BYTES else self.parse_small
        return await asyncio.get_running_loop().run_in_executor(lane, fn, *args)

    async def respond(self, tokens: int, fn: Callable, *args):
        """``fn(*args)``, building an answer that covers ``tokens`` tokens (prompt and output,
        with their texts and logprobs): on the event loop up to ``SMALL_ANSWER_TOKENS``, else on
        the format lane."""
        if tokens <= SMALL_ANSWER_TOKENS:
            return fn(*args)
        return await asyncio.get_running_loop().run_in_executor(self.format, fn, *args)

    def compile_lane(self, size: int) -> GrammarThreads:
        """The compile lane of a constraint whose JSON text has ``size`` bytes."""
        return self.compile_large if size > SMALL_CONSTRAINT_BYTES else self.compile_small

    def shutdown(self) -> None:
        for pool in (self.parse_small, self.parse_large, self.format):
            pool.shutdown(wait=False, cancel_futures=True)
        for threads in (self.compile_small, self.compile_large):
            threads.shutdown()
