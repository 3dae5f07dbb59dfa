"""The torch-free part of a run's environment: the CPU's model and SIMD flags and the
versions of the packages that can change a run's numbers. stalebench.job's `environment`
adds torch's build to them for summary.json's `host`; the reports, which import no torch,
read package versions from here for a saved sweep's provenance."""

from __future__ import annotations

import importlib.metadata
import platform
import re
from typing import Any

# The packages whose versions can change a run's numbers (stalebench's own included).
PACKAGES = (
    "torch", "numpy", "scipy", "mnist1d", "hydra-core", "omegaconf", "pandas", "pyarrow",
    "stalebench",
)  # fmt: skip
# The CPU flags kept: the SIMD and floating-point extensions, which decide the kernels torch
# and the BLAS pick and so the order of a float sum (x86: sse*, ssse3, avx*, fma*, f16c,
# amx*; Arm: fp, asimd*, fphp, sve*, sme*, bf16, i8mm). The rest (virtualisation, security
# mitigations, power management) changes no float result and differs between hosts of one
# CPU model, so recording it would only make noise.
SIMD_FLAGS = re.compile(r"^(sse|ssse3|avx|fma|f16c|amx|fp$|asimd|fphp|sve|sme(?!p)|bf16|i8mm)")


def package_version(package: str) -> str | None:
    """The installed version of `package`, None when it is not installed."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def cpu(cpuinfo: str | None = None) -> dict[str, Any]:
    """The CPU's model and its SIMD_FLAGS, from /proc/cpuinfo (`cpuinfo`: its text) on
    Linux; elsewhere the model platform names and flags None (not known)."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            return {"model": platform.processor() or platform.machine(), "flags": None}
    first: dict[str, str] = {}  # the first processor's fields (every core's are the same)
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            first.setdefault(key.strip(), value.strip())
    # x86: `model name`, `flags`; Arm: no model name but implementer and part, `Features`
    model = first.get("model name") or first.get("Hardware") or first.get("Processor")
    if not model and "CPU part" in first:
        model = f"implementer {first.get('CPU implementer')} part {first['CPU part']}"
    flags = (first.get("flags") or first.get("Features") or "").split()
    return {
        "model": model or platform.processor() or platform.machine(),
        "flags": sorted({f for f in flags if SIMD_FLAGS.match(f)}),
    }
