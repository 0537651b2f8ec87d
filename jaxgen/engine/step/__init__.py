"""One engine step on the device: its layout and host batch, the executor that launches and reads it, the model runner, the jitted step, the engine's step modes."""
