"""Weights that change under a running engine (RL post-training, docs/rl.md): the layout new
weights are checked against and placed by (``weight_layout``), and sleep mode, which frees the
KV pool and the weights between rollouts (``sleep_mode``). ``LLMEngine.update_weights``,
``sleep`` and ``wake_up`` act through them."""

from jaxgen.engine.weights.sleep_mode import SleepMode, memory_in_use, require_idle
from jaxgen.engine.weights.weight_layout import WeightLayout, named_values

__all__ = ["SleepMode", "WeightLayout", "memory_in_use", "named_values", "require_idle"]
