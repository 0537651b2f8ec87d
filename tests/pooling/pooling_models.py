"""Tiny random pooling checkpoints (sentence-transformers files written beside a decoder, BERT /
RoBERTa / XLM-R encoders and cross-encoders built with transformers) and the references their
outputs are checked against: transformers' hidden states pooled as sentence-transformers does."""

from __future__ import annotations

import json
import os

import numpy as np

# Our pooling types -> sentence-transformers' pooling modes.
ST_MODES = {"LAST": "lasttoken", "MEAN": "mean", "CLS": "cls"}


def write_pooling_files(path: str, pooling_type: str, *, normalize: bool = True, dim: int = 64):
    """sentence-transformers' ``modules.json`` and ``1_Pooling/config.json`` in ``path`` (the
    legacy ``pooling_mode_*`` flags, as Qwen3-Embedding and e5-mistral ship them)."""
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling",
        },
    ]
    if normalize:
        modules.append(
            {
                "idx": 2,
                "name": "2",
                "path": "2_Normalize",
                "type": "sentence_transformers.models.Normalize",
            }
        )
    with open(os.path.join(path, "modules.json"), "w") as f:
        json.dump(modules, f)
    os.makedirs(os.path.join(path, "1_Pooling"), exist_ok=True)
    flags = {f"pooling_mode_{m}": False for m in ("cls_token", "mean_tokens", "lasttoken")}
    key = {"LAST": "lasttoken", "MEAN": "mean_tokens", "CLS": "cls_token"}[pooling_type]
    flags[f"pooling_mode_{key}"] = True
    with open(os.path.join(path, "1_Pooling", "config.json"), "w") as f:
        json.dump({"word_embedding_dimension": dim, **flags}, f)


def drop_chat_template(path: str) -> None:
    """Removes the tokenizer's chat template (sentence-transformers 6 renders plain text through
    a chat template when the tokenizer has one; embedding checkpoints embed text as it is)."""
    config_file = os.path.join(path, "tokenizer_config.json")
    with open(config_file) as f:
        config = json.load(f)
    config.pop("chat_template", None)
    with open(config_file, "w") as f:
        json.dump(config, f)
    for name in ("chat_template.jinja", "chat_template.json"):
        if os.path.exists(os.path.join(path, name)):
            os.remove(os.path.join(path, name))


def pooled(hidden: np.ndarray, pooling_type: str, normalize: bool = True) -> np.ndarray:
    """One sequence's hidden states [L, D] pooled as sentence-transformers pools them."""
    vector = {"LAST": hidden[-1], "MEAN": hidden.mean(0), "CLS": hidden[0]}[pooling_type]
    return vector / np.linalg.norm(vector) if normalize else vector


def hf_hidden_states(path: str, token_lists: list[list[int]], token_types=None) -> list[np.ndarray]:
    """transformers' (fp32) ``AutoModel`` last hidden states, one sequence at a time."""
    import torch
    import transformers

    model = transformers.AutoModel.from_pretrained(path, dtype=torch.float32).eval()
    out = []
    for i, tokens in enumerate(token_lists):
        kwargs = {}
        if token_types is not None:
            kwargs["token_type_ids"] = torch.tensor([token_types[i]])
        with torch.no_grad():
            out.append(model(torch.tensor([tokens]), **kwargs).last_hidden_state[0].numpy())
    return out


def agreement(ours, reference) -> tuple[float, float]:
    """(max |difference|, smallest cosine) over rows of two [N, D] arrays."""
    ours, reference = np.asarray(ours, np.float64), np.asarray(reference, np.float64)
    cosine = (ours * reference).sum(-1) / (
        np.linalg.norm(ours, axis=-1) * np.linalg.norm(reference, axis=-1)
    )
    return float(np.abs(ours - reference).max()), float(cosine.min())
