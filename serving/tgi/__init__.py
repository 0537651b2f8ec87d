"""Text Generation Inference's routes."""
