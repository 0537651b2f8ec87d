"""Scoring a model against another: whole-sequence logits and teacher-forced agreement."""
