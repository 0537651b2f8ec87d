"""Every kept GGUF quantisation type as a ``QuantizedWeight`` whose dequantisation is the file's
(``gguf.quants.dequantize``) bit for bit, in the documented layout and memory; and a type jaxgen
does not load named, with its tensor, when the file is opened."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from jaxgen.loaders.gguf_blocks import decode_blocks
from jaxgen.loaders.gguf_loader import GGUFFile
from jaxgen.quantization.bit_planes import CODE_BITS
from tests.gguf_quant_blocks import KEPT_GGUF_TYPES, random_gguf_tensor

# type -> (kind, group size, scales: "float16" per group or "two-level" (float16 per 256
# weights times a code per group: int8, or 4-bit two a byte), minimums, bits a weight in
# memory, in the file)
LAYOUTS = {
    "Q8_0": ("int8", 32, "float16", False, 8.5, 8.5),
    "Q4_0": ("int4", 32, "float16", False, 4.5, 4.5),
    "Q4_1": ("int4", 32, "float16", True, 5.0, 5.0),
    "Q5_0": ("int5", 32, "float16", False, 5.5, 5.5),
    "Q5_1": ("int5", 32, "float16", True, 6.0, 6.0),
    "IQ4_NL": ("int4", 32, "float16", False, 4.5, 4.5),
    "Q2_K": ("int2", 16, "two-level", True, 2.625, 2.625),
    "Q3_K": ("int3", 16, "two-level", False, 3.5625, 3.4375),
    "Q4_K": ("int4", 32, "two-level", True, 4.625, 4.5),
    "Q5_K": ("int5", 32, "two-level", True, 5.625, 5.5),
    "Q6_K": ("int6", 16, "two-level", False, 6.5625, 6.5625),
    "IQ4_XS": ("int4", 32, "two-level", False, 4.3125, 4.25),
}


def _write(path, tensors: dict) -> str:
    """A llama GGUF of ``tensors`` ({gguf name: (type name, [rows, bytes] or float array)})."""
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(1)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    for name, (qtype, data) in tensors.items():
        writer.add_tensor(name, data, raw_dtype=gguf.GGMLQuantizationType[qtype])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_every_kept_type_is_tabled():
    assert set(LAYOUTS) == set(KEPT_GGUF_TYPES)


@pytest.mark.parametrize("qtype", KEPT_GGUF_TYPES)
def test_decoded_blocks_are_the_files_numbers(qtype):
    """Random valid blocks (every code and sub-scale pattern): codes * scales + mins in float32
    equal ``gguf.quants.dequantize`` exactly."""
    rng = np.random.default_rng(sum(map(ord, qtype)))
    data = random_gguf_tensor(qtype, 6, 512, rng)
    expected = gguf.quants.dequantize(data, gguf.GGMLQuantizationType[qtype]).reshape(6, 512)
    decoded = decode_blocks(qtype, data, 6, 512)
    codes = decoded.codes.astype(np.float32)
    if decoded.codebook is not None:  # IQ4: indices into the 16-entry grid
        codes = np.asarray(decoded.codebook, np.float32)[decoded.codes]
    elif decoded.kind != "int8" and decoded.mins is None:
        codes = codes - 2 ** (CODE_BITS[decoded.kind] - 1)  # symmetric: u - 2^(b-1)
    weight = codes.reshape(6, -1, decoded.group_size) * decoded.group_scales()[..., None]
    if decoded.mins is not None:
        weight = weight + decoded.group_mins()[..., None]
    np.testing.assert_array_equal(weight.reshape(6, 512), expected)


@pytest.mark.parametrize("qtype", KEPT_GGUF_TYPES)
def test_kept_weight_dequantises_to_the_file_and_has_its_layout(tmp_path, qtype):
    """Through ``GGUFFile.get_quantized``: a plain tensor and a rotary-permuted one (q_proj,
    whose rows the loader restores for codes, scales and mins alike) equal ``get_tensor``
    (``gguf.quants.dequantize``) exactly; kind, group, scale dtype and memory as tabled."""
    rng = np.random.default_rng(7)
    up, q = random_gguf_tensor(qtype, 40, 512, rng), random_gguf_tensor(qtype, 64, 256, rng)
    path = _write(
        str(tmp_path / f"{qtype}.gguf"),
        {"blk.0.ffn_up.weight": (qtype, up), "blk.0.attn_q.weight": (qtype, q)},
    )
    gguf_file = GGUFFile(path)
    kind, group, scale_dtype, has_mins, bits, file_bits = LAYOUTS[qtype]
    for name in ("model.layers.0.mlp.up_proj.weight", "model.layers.0.self_attn.q_proj.weight"):
        weight = gguf_file.get_quantized(name)
        assert (weight.kind, weight.group_size) == (kind, group)
        two_level = scale_dtype == "two-level"
        assert weight.two_level == two_level and (weight.mins is not None) == has_mins
        assert weight.scales.dtype == "float16"
        assert (weight.codebook is not None) == qtype.startswith("IQ4")
        if two_level:  # a float16 number per 256 weights, a code per group
            assert weight.scales.shape == (weight.shape[0] // 256, weight.shape[1])
            per_byte = 2 if qtype == "Q2_K" else 1  # Q2_K's 4-bit codes, two a byte
            assert weight.scale_codes.shape == (
                weight.shape[0] // group // per_byte,
                weight.shape[1],
            )
        np.testing.assert_array_equal(np.asarray(weight.dequantize()), gguf_file.get_tensor(name).T)
    up_weight = gguf_file.get_quantized("model.layers.0.mlp.up_proj.weight")
    raw = gguf.quants.dequantize(up, gguf.GGMLQuantizationType[qtype])
    np.testing.assert_array_equal(np.asarray(up_weight.dequantize()), raw.reshape(40, 512).T)
    assert up_weight.nbytes * 8 / (40 * 512) == bits
    assert up.nbytes * 8 / (40 * 512) == file_bits


@pytest.mark.parametrize("qtype", ["IQ2_XXS", "IQ3_S", "TQ1_0", "Q8_1", "Q8_K", "IQ1_M"])
def test_unsupported_type_names_itself_and_its_tensor_when_opened(tmp_path, qtype):
    elements, nbytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]]
    data = np.zeros((8, 256 // elements * nbytes), np.uint8)
    path = _write(
        str(tmp_path / f"{qtype}.gguf"),
        {"blk.0.ffn_up.weight": ("Q8_0", random_gguf_tensor("Q8_0", 8, 256, np.random.default_rng(0))),
         "blk.0.ffn_down.weight": (qtype, data)},
    )  # fmt: skip
    with pytest.raises(
        ValueError, match=rf"'blk\.0\.ffn_down\.weight' has quantization type {qtype}"
    ):
        GGUFFile(path)
