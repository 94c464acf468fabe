"""Which devices a host offers: its GPUs, or virtual devices (a CPU share each) without them."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceInfo:
    id: str  # "<node>/<index>"
    node: str
    index: int
    kind: str  # "gpu" or "virtual"
    model: str
    memory_bytes: int = 0
    cpus: tuple[int, ...] = ()  # virtual devices: the cores this device stands for

    def to_dict(self) -> dict:
        return {
            "id": self.id,
            "node": self.node,
            "index": self.index,
            "kind": self.kind,
            "model": self.model,
            "memory_bytes": self.memory_bytes,
            "cpus": list(self.cpus),
        }


def _nvidia_gpus() -> list[tuple[str, int]]:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return []
    try:
        out = subprocess.run(
            [exe, "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    gpus = []
    for line in out.strip().splitlines():
        name, _, mem = line.partition(",")
        try:
            gpus.append((name.strip(), int(float(mem.strip())) * 1024 * 1024))
        except ValueError:
            gpus.append((name.strip(), 0))
    return gpus


def discover_devices(node: str, virtual: int | None = None) -> list[DeviceInfo]:
    """The host's GPUs, or ``virtual`` virtual devices when ``virtual`` is given or there are no
    GPUs. Virtual device ``i`` stands for CPU core ``i mod ncores``: a job on it is pinned there,
    so two jobs packed on one virtual device really do share (and slow) one core."""
    if not virtual:
        gpus = _nvidia_gpus()
        if gpus:
            return [
                DeviceInfo(f"{node}/{i}", node, i, "gpu", name, mem) for i, (name, mem) in enumerate(gpus)
            ]
    cores = (
        sorted(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else list(range(os.cpu_count() or 1))
    )
    n = virtual or len(cores)
    return [
        DeviceInfo(f"{node}/{i}", node, i, "virtual", "virtual-cpu", 0, (cores[i % len(cores)],))
        for i in range(n)
    ]
