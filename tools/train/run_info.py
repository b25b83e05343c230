"""What a training run's summary (training.json) records about where it ran: the CPU, threads,
device and library versions. Every recipe's driver writes the same fields."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import numpy as np
import tokenizers
import torch


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def hardware(threads: int, device: str = "cpu") -> dict:
    return {"cpu": cpu_name(), "logical_cpus": os.cpu_count(), "threads": threads,
            "device": device,
            "gpu": torch.cuda.get_device_name() if device == "cuda" else None}


def versions() -> dict:
    return {"python": platform.python_version(), "torch": torch.__version__,
            "tokenizers": tokenizers.__version__, "numpy": np.__version__}
