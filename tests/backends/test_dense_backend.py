"""``dense_attention``, the pooling step's attention: each padded sequence of the flat batch on
its own, causal or both ways, with a sliding window that reaches back (decoders) or both ways
(encoders: ModernBERT's local layers), checked against a loop over each query row."""

from __future__ import annotations

import numpy as np
import pytest

from jaxgen.backends.dense import dense_attention

LENGTHS = [11, 3, 0, 16]  # real rows of each of 4 slots of 16 rows (one a padding slot)


def _reference(q, k, v, lengths, *, scale, causal, window):
    """Row by row: softmax over the real keys in reach, zero where a row reaches none."""
    rows = q.shape[0] // len(lengths)
    out = np.zeros_like(q)
    for s, n in enumerate(lengths):
        for i in range(rows):
            keys = [
                j
                for j in range(n)
                if (not causal or j <= i) and (window is None or abs(i - j) < window)
            ]
            if not keys:
                continue
            row = s * rows + i
            base = s * rows + np.asarray(keys)
            scores = np.einsum("hd,khd->hk", q[row], k[base]) * scale
            probs = np.exp(scores - scores.max(-1, keepdims=True))
            probs /= probs.sum(-1, keepdims=True)
            out[row] = np.einsum("hk,khd->hd", probs, v[base])
    return out


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [None, 1, 4])
def test_each_row_sees_its_sequences_real_rows_in_reach(causal, window):
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((64, 2, 8)).astype(np.float32) for _ in range(3))
    lengths = np.asarray(LENGTHS, np.int32)
    out = dense_attention(q, k, v, lengths, scale=0.3, causal=causal, sliding_window=window)
    expected = _reference(q, k, v, LENGTHS, scale=0.3, causal=causal, window=window)
    real = np.concatenate([np.arange(16) < n for n in LENGTHS])  # padding rows are never read
    np.testing.assert_allclose(np.asarray(out)[real], expected[real], atol=1e-5)
