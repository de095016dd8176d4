"""`bertforge info`: versions, devices, precision support, threads, and the measured matmul peak."""

from __future__ import annotations

import argparse
import json
import platform
import sys
from typing import Any


def info_add(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument(
        "--device", default="auto", help="device whose matmul peak to measure: auto|cpu|cuda[:N]|xpu|hpu|mps"
    )
    p.add_argument("--refresh", action="store_true", help="measure the matmul peak again instead of using the cache")


def collect(device_spec: str = "auto", refresh: bool = False) -> dict[str, Any]:
    import torch

    from bertforge import __version__
    from bertforge import device as dev

    device = dev.resolve_device(device_spec)
    peak = dev.matmul_peak(device, refresh=refresh)
    return {
        "bertforge": __version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": dev.cpu_model(),
        "threads": torch.get_num_threads(),
        "devices": dev.available_devices(),
        "chosen_device": str(device),
        "auto_precision": dev.resolve_precision("auto", device),
        "matmul_peak_gflops": {
            "device": peak.device,
            "size": peak.size,
            "threads": peak.threads,
            "fp32": round(peak.fp32_gflops, 1),
            "bf16": None if peak.bf16_gflops is None else round(peak.bf16_gflops, 1),
            "fp16": None if peak.fp16_gflops is None else round(peak.fp16_gflops, 1),
            "bf16_native": peak.bf16_native,
        },
    }


def info_run(args: argparse.Namespace) -> int:
    data = collect(args.device, args.refresh)
    if args.json:
        json.dump(data, sys.stdout, indent=2)
        print()
        return 0
    print(f"bertforge {data['bertforge']} | torch {data['torch']} | python {data['python']}")
    print(f"platform  {data['platform']}")
    print(f"cpu       {data['cpu']} ({data['threads']} torch threads)")
    print("devices:")
    for d in data["devices"]:
        mem = f", {d['memory_gb']} GiB" if d["memory_gb"] else ""
        bf16, fp16 = ("yes" if d[k] else "no" for k in ("bf16", "fp16"))
        print(f"  {d['device']:<8} {d['name']}{mem} | bf16 {bf16} | fp16 {fp16}")
    pk = data["matmul_peak_gflops"]
    fmt = lambda v: "n/a" if v is None else f"{v:,.0f} GFLOP/s"  # noqa: E731
    print(f"chosen    {data['chosen_device']} (auto precision: {data['auto_precision']})")
    print(
        f"matmul peak on {pk['device']} ({pk['size']}x{pk['size']}, {pk['threads']} threads): "
        f"fp32 {fmt(pk['fp32'])} | bf16 {fmt(pk['bf16'])} | fp16 {fmt(pk['fp16'])}"
    )
    if not pk["bf16_native"] and data["chosen_device"] == "cpu":
        print("bf16 is emulated on this device (no AVX-512 BF16, AMX or Arm BF16): fp32 is the fast path here")
    elif not pk["bf16_native"]:  # a GPU before Ampere (V100, T4): fp16's tensor cores, not fp32, are its fast path
        fast = "fp16" if (pk["fp16"] or 0) > pk["fp32"] else "fp32"
        print(f"bf16 is not native on this device: {fast} is the fast path here")
    print("(the MFU that bertforge reports divides by this measured peak)")
    return 0
