"""The compiled step built for other CPUs than this one: AVX2+FMA (x86-64-v3) and plain x86-64 (SSE2).

A CI machine or a user's may lack AVX-512, and then vec16.h's other branches run, with the int8-input kernels of
int8dot_avx2.h (x86-64-v3) or the float ones (plain x86-64). Each target is built (PARLEY_NATIVE_MARCH) and checked in a child process, since a process
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
import sys
from llm_engine.native.decoder import NativeDecoder
features = build.load().parley_features()
assert features == int(sys.argv[1]), f"features {features}: VNNI (1) or AVX2 (2) kernels compiled for the wrong target"
dots = (False, None) if features else (False,)  # plain x86-64 has no int8-input kernel: None is False there
if not features:
    probe = tiny("int4")
    assert NativeDecoder(probe, cache_for(probe), int8_dot=None).int8_kernel is None, "plain x86-64 took an int8-input kernel"
worst = {(dot, kv): 0.0 for dot in dots for kv in (torch.float32, torch.float16)}
half = torch.float16  # the cache's element: converted by F16C on x86-64-v3, by libgcc on plain x86-64
for scheme, group, head_dim, kv in (("none", 32, 64, torch.float32), ("int8", 32, 32, torch.float32), ("int8", 32, 64, half),
                                    ("int4", 32, 64, torch.float32), ("int4", 64, 64, half), ("int4", 16, 32, half)):
  for dot in dots:  # the float kernels; the target's own choice (AVX2's int8-input kernels on x86-64-v3)
    model = tiny(scheme, bias=True, group_size=group, head_dim=head_dim)
    ref_cache, cache = cache_for(model, dtype=kv), cache_for(model, dtype=kv)
    decoder = NativeDecoder(model, cache, int8_dot=dot)
    prefill(model, [ref_cache, cache], 1, [(7 * i + 3) % 300 for i in range(40)])
    prefill(model, [ref_cache, cache], 2, [27, 18])
    tokens, positions, slots = [7, 8], [40, 2], [1, 2]
    for _ in range(3):
        want = reference_step(model, ref_cache, tokens, positions, slots)
        worst[dot, kv] = max(worst[dot, kv], relative_error(decoder.decode(tokens, positions, slots), want))
        tokens, positions = [int(t) for t in want.argmax(-1)], [p + 1 for p in positions]
print("worst", *(worst.get(key, 0.0) for key in [(False, torch.float32), (False, half), (None, torch.float32), (None, half)]))
"""


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the targets named here are x86-64 ones")
@pytest.mark.parametrize(("march", "features"), [("x86-64-v3", 2), ("x86-64", 0)])
def test_other_cpu_targets_match_the_float_forward(march: str, features: int) -> None:
    env = {**os.environ, "PARLEY_NATIVE_MARCH": march}
    here = os.path.dirname(__file__)
    proc = subprocess.run([sys.executable, "-c", CHECK, str(features)], cwd=here, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    full, half, dot_full, dot_half = (float(w) for w in proc.stdout.split("worst")[-1].split())
    # float16 keys: a one-step rounding difference is allowed (see test_native's float16 cache test)
    assert full < 2e-5 and half < 2e-4, proc.stdout
    # the int8-input kernels round each 32-wide input block to ~16 bits (test_native's bound); plain x86-64 has none
    # (the child checked that a decoder there takes the float kernels, and reports 0 for the pass it did not run)
    assert dot_full < 2e-3 and dot_half < 2e-3, proc.stdout
