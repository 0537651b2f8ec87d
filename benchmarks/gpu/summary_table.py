"""The tables the device check prints last (the device returns the end of the output): one line
per stage, then end to end beside the torch peer, then the kernel's bandwidth and the decode
matmuls'."""

from __future__ import annotations

import importlib

from benchmarks.gpu.report import format_table, print_block

STAGE_COLUMNS = [
    ("stage", "stage"),
    ("status", "status"),
    ("seconds", "s"),
    ("compiles", "compiles"),
    ("compile_s", "compile s"),
    ("summary", "summary"),
]
E2E_COLUMNS = [
    ("batch", "batch"),
    ("knobs", "knobs"),
    ("tok/s", "jaxgen tok/s"),
    ("peer tok/s", "torch tok/s"),
    ("x peer", "x torch"),
    ("ms/step", "decode ms/step"),
    ("peer ms/step", "torch ms/step"),
    ("floor ms", "floor ms"),
    ("x floor", "x floor"),
    ("device ms", "device ms"),
    ("host ms", "host ms"),
    ("compiles", "timed compiles"),
    ("note", "note"),
]
BANDWIDTH_COLUMNS = [
    ("batch", "batch"),
    ("context", "context"),
    ("tuning", "tuning"),
    ("us", "us/call"),
    ("TB/s", "TB/s"),
    ("of copy", "of copy bw"),
    ("device us", "device us"),
    ("device of copy", "device of copy"),
    ("error", "error"),
]

GEMM_COLUMNS = [
    ("matmul", "matmul (M x K x N)"),
    ("variant", "xla_gemm"),
    ("us", "us/call"),
    ("of copy", "of copy bw"),
    ("device us", "device us"),
    ("device of copy", "device of copy"),
    ("kernel", "largest kernel"),
    ("error", "error"),
]


def peer_summary(result: dict) -> str:
    parts = [
        f"b{row['batch']} {row['output_tok_s']:.0f} tok/s"
        for row in result.get("rows", [])
        if "output_tok_s" in row and not row.get("compiled")
    ]
    return "; ".join(parts + [str(result.get("torch_compile", ""))])


def stage_summary(name: str, stage: dict) -> str:
    if stage.get("status") == "skipped":
        return stage.get("reason", "")
    if "error" in stage:
        return stage["error"][:120]
    result = stage.get("result", {})
    try:
        if name == "torch_peer":
            text = peer_summary(result)
        else:
            text = importlib.import_module(f"benchmarks.gpu.{name}").summary(result)
    except Exception as error:  # a summary must never hide the table
        text = f"(no summary: {type(error).__name__}: {error})"
    if result.get("error"):
        text += f" ERROR: {str(result['error'])[:100]}"
    return text


def e2e_rows(e2e: dict, peer: dict) -> list[dict]:
    from benchmarks.gpu.end_to_end import table_rows

    eager = {row["batch"]: row for row in peer.get("rows", []) if not row.get("compiled")}
    rows = table_rows(e2e)
    for row in rows:
        match = eager.get(row["batch"]) if row["knobs"] == "-" else None
        if match and "output_tok_s" in match:
            row["peer tok/s"] = match["output_tok_s"]
            row["peer ms/step"] = match["decode_ms_per_step"]
            if row.get("tok/s"):
                row["x peer"] = row["tok/s"] / match["output_tok_s"]
    return rows


def print_tables(data: dict) -> None:
    stages = data.get("stages", {})
    meta = data.get("meta", {})
    device = stages.get("machine", {}).get("result", {}).get("device_kind", "?")
    rows = [
        {"stage": name, **stage, "summary": stage_summary(name, stage)}
        for name, stage in stages.items()
    ]
    e2e = stages.get("end_to_end", {}).get("result", {})
    peer = stages.get("torch_peer", {}).get("result", {})
    if e2e.get("rows"):
        print_block("end to end vs torch peer (x floor: decode step / floor)", format_table(
            e2e_rows(e2e, peer), E2E_COLUMNS))  # fmt: skip
    bandwidth = stages.get("kernel_bandwidth", {}).get("result", {})
    if bandwidth.get("rows"):
        from benchmarks.gpu.kernel_bandwidth import table_rows

        print_block(
            "attention kernel bandwidth", format_table(table_rows(bandwidth), BANDWIDTH_COLUMNS)
        )
    gemms = stages.get("gemm_bandwidth", {}).get("result", {})
    if gemms.get("rows"):
        from benchmarks.gpu.gemm_bandwidth import table_rows as gemm_rows

        print_block("decode matmuls, weights cold", format_table(gemm_rows(gemms), GEMM_COLUMNS))
    title = (
        f"device check on {device} ({meta.get('profile')}, commit {meta.get('commit')}): "
        f"{meta.get('seconds', 0):.0f} s, {meta.get('compiles')} compiles in the main process"
    )
    print_block(title, format_table(rows, STAGE_COLUMNS))
