"""bench.cpu_classes --tiny: the AVX2 build is made and measured on this machine whatever its CPU, with its int8-input
kernels and with the float ones, and every row says which kernels it ran."""
from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the AVX2 target is an x86-64 one")
def test_cpu_classes_tiny_measures_the_avx2_build_here() -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "bench.cpu_classes", "--tiny"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {line.split("  ")[0]: line for line in proc.stdout.splitlines() if line.startswith("ours")}
    assert len(rows) == 2, proc.stdout  # --tiny: the AVX2 build's two rows (this CPU's own build is test_native's)
    avx2, before = rows["ours, AVX2 build, int8-input kernels"], rows["ours, AVX2 build, float kernels (before)"]
    assert "features 2:" in avx2 and "int8-input AVX2 kernel" in avx2, avx2  # built for AVX2: no VNNI compiled in
    assert "features 2:" in before and "int4 on the float kernel" in before, before
    for label, line in rows.items():
        assert float(line[len(label):].split()[0]) > 0, line  # tokens/s, the median of the runs
