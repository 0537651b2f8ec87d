"""The default model in every GGUF quantisation type people download, written by llama.cpp's own
``llama-quantize`` (real files of a real model, for ``gguf_perplexity.py`` and ``gguf_types.py``).

    python benchmarks/gguf_quantized_files.py [--out DIR] [--llama-quantize PATH] [--types ...]

The default GGUF is first written back as float32 (every tensor dequantised by the ``gguf``
package, metadata kept), then quantised into each type. SmolLM2-135M's hidden size (576) is not
a multiple of 256, so llama.cpp's K-quant mixes fall back to Q5_0 / Q5_1 / Q8_0 / IQ4_NL for the
tensors whose rows are 576 wide (``ffn_down``, 1536 wide, keeps the K-quant): each file holds
the mix llama.cpp chose, listed when written.
"""

from __future__ import annotations

import argparse
import collections
import glob
import os
import subprocess

import gguf
import numpy as np

TYPES = ("Q4_K_M", "Q4_K_S", "Q5_K_M", "Q6_K", "Q3_K_M", "Q2_K", "Q5_0", "Q5_1", "Q8_0",
         "IQ4_NL", "IQ4_XS")  # fmt: skip


def float_copy(source: str, target: str) -> None:
    """``source`` with every tensor dequantised to float32 and its metadata kept."""
    reader = gguf.GGUFReader(source)
    writer = gguf.GGUFWriter(target, reader.fields["general.architecture"].contents())
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        if name == "general.file_type":
            writer.add_file_type(gguf.LlamaFileType.ALL_F32)
            continue
        array = field.types[0] == gguf.GGUFValueType.ARRAY
        writer.add_key_value(
            name, field.contents(), field.types[0], sub_type=field.types[-1] if array else None
        )
    for tensor in reader.tensors:
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        writer.add_tensor(tensor.name, values.reshape([int(n) for n in reversed(tensor.shape)]))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="/tmp/gguf-types")
    parser.add_argument("--llama-quantize", default=None, help="default: the build_llamacpp.sh one")
    parser.add_argument("--types", nargs="+", default=list(TYPES))
    args = parser.parse_args()

    from jaxgen.loaders.default_model import default_model_path

    binary = args.llama_quantize or next(
        iter(
            sorted(
                glob.glob("/tmp/lcpp/llama_cpp_python-*/vendor/llama.cpp/build/bin/llama-quantize")
            )
        ),
        None,
    )
    if binary is None:
        raise SystemExit("no llama-quantize: build it with ../shared/tools/build_llamacpp.sh")
    os.makedirs(args.out, exist_ok=True)
    f32 = os.path.join(args.out, "smollm2-F32.gguf")
    if not os.path.exists(f32):
        float_copy(default_model_path(), f32)
    for kind in args.types:
        target = os.path.join(args.out, f"smollm2-{kind}.gguf")
        subprocess.run([binary, f32, target, kind, "2"], check=True, capture_output=True)
        types = collections.Counter(t.tensor_type.name for t in gguf.GGUFReader(target).tensors)
        print(target, dict(types))


if __name__ == "__main__":
    main()
