"""benchmarks/gpu.py, the benchmark against plain PyTorch on the same GPU: its smoke mode runs
every arm on the CPU in seconds and writes only where it is told; without CUDA its full mode
refuses rather than record CPU figures as a GPU's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import gpu

ROOT = Path(__file__).resolve().parents[2]
ARMS = {"plain", "real_1", "real_2", "real_1_cpu_server", "sim_batched"}


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_the_smoke_run_measures_every_arm_and_writes_only_its_out(tmp_path):
    results = ROOT / "benchmarks" / "results"
    before = {p.name: p.stat().st_mtime_ns for p in results.iterdir()}
    out = tmp_path / "gpu.json"
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu.py"), "--smoke",
                          "--out", str(out)], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    data = json.loads(out.read_text())
    assert data["smoke"] and data["device"] == "cpu" and data["machine"]["torch"]
    assert list(data["figures"]) == ["resnet20/fp32"]
    fig = data["figures"]["resnet20/fp32"]
    assert set(fig["samples_per_s"]) == ARMS and not fig["errors"]
    assert all(rate > 0 for rate in fig["samples_per_s"].values())
    assert set(gpu.TARGETS) <= set(fig["ratios"]) and all(r > 0 for r in fig["ratios"].values())
    assert "allreduce_bsp/ddp_nccl" in data["skipped"]
    assert "| resnet20/fp32 | real_1/plain |" in run.stdout  # the table
    assert {p.name: p.stat().st_mtime_ns for p in results.iterdir()} == before


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is a machine without CUDA's")
def test_the_full_mode_refuses_without_cuda(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["gpu.py"])
    with pytest.raises(SystemExit, match="^no CUDA device: run with --smoke$"):
        gpu.main()
