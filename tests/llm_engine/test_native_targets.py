"""The compiled step built for other CPUs than this one: AVX2+FMA (x86-64-v3) and plain x86-64 (SSE2).

A CI machine or a user's may lack AVX-512, and then vec16.h's other branches and the float int4 kernel
are what run. Each target is built (PARLEY_NATIVE_MARCH) and checked in a child process, since a process
loads the library once.
"""
from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

CHECK = """
import torch
from llm_engine.native import build
from test_native import tiny, cache_for, prefill, reference_step, relative_error
from llm_engine.native.decoder import NativeDecoder
assert build.load().parley_features() == 0, "a target without AVX-512 VNNI compiled the VNNI path"
worst = 0.0
for scheme, group, head_dim in (("none", 32, 64), ("int8", 32, 32), ("int4", 32, 64), ("int4", 64, 64), ("int4", 16, 32)):
    model = tiny(scheme, bias=True, group_size=group, head_dim=head_dim)
    ref_cache, cache = cache_for(model), cache_for(model)
    decoder = NativeDecoder(model, cache)
    prefill(model, [ref_cache, cache], 1, [(7 * i + 3) % 300 for i in range(40)])
    prefill(model, [ref_cache, cache], 2, [27, 18])
    tokens, positions, slots = [7, 8], [40, 2], [1, 2]
    for _ in range(3):
        want = reference_step(model, ref_cache, tokens, positions, slots)
        worst = max(worst, relative_error(decoder.decode(tokens, positions, slots), want))
        tokens, positions = [int(t) for t in want.argmax(-1)], [p + 1 for p in positions]
print("worst", worst)
"""


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the targets named here are x86-64 ones")
@pytest.mark.parametrize("march", ["x86-64-v3", "x86-64"])
def test_other_cpu_targets_match_the_float_forward(march: str) -> None:
    env = {**os.environ, "PARLEY_NATIVE_MARCH": march}
    here = os.path.dirname(__file__)
    proc = subprocess.run([sys.executable, "-c", CHECK], cwd=here, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    worst = float(proc.stdout.split("worst")[-1])
    assert worst < 2e-5, proc.stdout
