"""Weight-only int8 (per output channel) and int4 (group-wise, asymmetric) Linear layers, and the swap.

Each layer keeps its codes once and picks the fastest correct kernel per call (torch's int8/int4 pack
matmuls for few rows, dequantize+matmul for many). It knows nothing about files or the engine
(GGUF blocks come in through gguf_quant.py).
"""
from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

Scheme = Literal["none", "int8", "int4"]
SCHEMES: tuple[str, ...] = ("none", "int8", "int4")

# Above this many rows the CPU pack kernels lose to dequantize+matmul. Measured on the 2-core Xeon for a
# 1536x576 layer with torch 2.13: the kernels cost ~11 us per row, dequantize+matmul ~3-5 ms
# flat, so the crossover is ~250 rows (int8) and ~450 (int4); a 128-token prefill chunk stays on the kernel.
KERNEL_MAX_ROWS = 256
_LINEAR_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "qkv_proj", "gate_up_proj")


# Both pack kernels are vectorised for bfloat16 only (fp32 on CPU is ~10x slower than plain fp32 matmul).
KERNEL_DTYPE = torch.bfloat16


def _finish(y: torch.Tensor, bias: torch.Tensor | None, lead: torch.Size) -> torch.Tensor:
    """y [M, N] -> [*lead, N] with the bias added."""
    if bias is not None:
        y = y + bias.to(y.dtype)
    return y.view(*lead, y.shape[-1])


class Int8WeightOnlyLinear(nn.Module):
    """y = x @ (q * scale)^T + b with q int8 [N, K], scale [N] (symmetric, one scale per output channel)."""

    def __init__(self, qweight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None, *, use_kernel: bool = True) -> None:
        super().__init__()
        self.out_features, self.in_features = qweight.shape
        self.register_buffer("qweight", qweight.to(torch.int8).contiguous())  # [N, K]
        self.register_buffer("scales", scales.float().contiguous())  # [N]
        self.register_buffer("bias", None if bias is None else bias.detach().clone())
        self.use_kernel = use_kernel
        self._kscales: torch.Tensor | None = None  # scales in the kernel's dtype, on the kernel's device

    @classmethod
    def from_float(cls, weight: torch.Tensor, bias: torch.Tensor | None = None, *, use_kernel: bool = True) -> "Int8WeightOnlyLinear":
        w = weight.detach().float()  # [N, K]
        scales = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-12)  # [N]
        q = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8)
        return cls(q, scales, bias, use_kernel=use_kernel).to(weight.device)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self.qweight.to(dtype) * self.scales.to(dtype)[:, None]  # [N, K]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)  # [M, K]
        if self.uses_kernel(x2.shape[0]):
            kd = KERNEL_DTYPE
            if self._kscales is None or self._kscales.device != x.device:
                self._kscales = self.scales.to(device=x.device, dtype=kd)
            y = torch._weight_int8pack_mm(x2.to(kd), self.qweight, self._kscales).to(x.dtype)
        else:
            y = F.linear(x2, self.dequantize(x.dtype))
        return _finish(y, self.bias, lead)

    def uses_kernel(self, rows: int) -> bool:
        """Whether `rows` input rows go through the int8 pack kernel (bfloat16 output) or dequantize+matmul."""
        return self.use_kernel and rows <= KERNEL_MAX_ROWS

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, kernel={self.use_kernel}"


class Int8Head(Int8WeightOnlyLinear):
    """The output head: int8 per channel through the bfloat16 kernel, with the top logits redone in float32.

    The kernel returns bfloat16, whose step at a logit of ~30 is 0.125: a near-tie (common at the first
    token of a reply) would round to an exact tie and greedy decoding would pick by index. Every logit
    within 2^-6 of its row's maximum (a few bfloat16 steps) is recomputed from its int8 row in float32, so
    the argmax is the int8 head's exact argmax; the other logits keep bfloat16 precision (about 0.4 %).
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x).float()  # [..., V]
        if not self.uses_kernel(x.numel() // self.in_features):
            return y  # the dequantize path computed in the model's dtype already
        y2, x2 = y.view(-1, self.out_features), x.reshape(-1, self.in_features).float()
        top = y2.amax(dim=-1, keepdim=True)  # [M, 1]
        rows, cols = (y2 >= top - top.abs() * 2.0**-6).nonzero(as_tuple=True)
        exact = (x2[rows] * (self.qweight[cols].float() * self.scales[cols, None])).sum(-1)  # [C]
        if self.bias is not None:
            exact = exact + self.bias[cols].float()
        y2[rows, cols] = exact
        return y


def pick_inner_k_tiles(in_features: int) -> int:
    for tiles in (8, 4, 2):
        if in_features % (tiles * 16) == 0:
            return tiles
    raise ValueError(f"int4 needs in_features divisible by 32, got {in_features}")


class Int4WeightOnlyLinear(nn.Module):
    """y = x @ W^T + b with W[n, k] = q[n, k] * scale[n, g] + minimum[n, g], q in 0..15, g = k // group_size.

    This is exactly llama.cpp's Q4_1 block (group 32, scale d, minimum m), so Q4_1 loads without rounding.
    Codes are stored two per byte, low nibble = even k; the kernel layout is built per device on first use.
    """

    def __init__(
        self,
        codes: torch.Tensor,  # [N, K] uint8 in 0..15
        scales: torch.Tensor,  # [N, K // group_size]
        minimums: torch.Tensor,  # [N, K // group_size]
        group_size: int,
        bias: torch.Tensor | None = None,
        *,
        use_kernel: bool = True,
    ) -> None:
        super().__init__()
        n, k = codes.shape
        if k % group_size or group_size % 2:
            raise ValueError(f"in_features {k} must be a multiple of group_size {group_size} (even)")
        self.out_features, self.in_features, self.group_size = n, k, group_size
        c = codes.to(torch.uint8)
        self.register_buffer("packed", (c[:, 0::2] | (c[:, 1::2] << 4)).contiguous())  # [N, K/2]
        self.register_buffer("scales", scales.float().contiguous())  # [N, G]
        self.register_buffer("minimums", minimums.float().contiguous())  # [N, G]
        self.register_buffer("bias", None if bias is None else bias.detach().clone())
        # GGUF Q4_K's own factors, [N, K/256, 24] uint8 records (llm_engine/native/int4_vnni.h, KBlock): the
        # compiled step reads them instead of the float32 pairs they produce (scales = d * sc, minimums = -dmin * m)
        self.register_buffer("kblocks", None)
        self.use_kernel = use_kernel
        self._kernel: tuple[torch.device, torch.Tensor, torch.Tensor] | None = None  # device, weight, scales_and_zeros

    @classmethod
    def from_float(
        cls, weight: torch.Tensor, bias: torch.Tensor | None = None, *, group_size: int = 32, use_kernel: bool = True
    ) -> "Int4WeightOnlyLinear":
        n, k = weight.shape
        w = weight.detach().float().view(n, k // group_size, group_size)  # [N, G, gs]
        # Scale and minimum are float16 values, as in a GGUF Q4_1 block: the compiled CPU decode step reads
        # them at half the bytes (llm_engine/native), and the codes are rounded against the stored values.
        lo = w.amin(-1).clamp(-65504, 65504).half().float()  # [N, G]
        scales = ((w.amax(-1) - lo) / 15.0).clamp(min=2.0**-14, max=65504).half().float()
        codes = torch.round((w - lo[..., None]) / scales[..., None]).clamp(0, 15).to(torch.uint8).view(n, k)
        return cls(codes, scales, lo, group_size, bias, use_kernel=use_kernel).to(weight.device)

    def codes(self) -> torch.Tensor:
        """-> [N, K] uint8 in 0..15."""
        return torch.stack([self.packed & 0xF, self.packed >> 4], dim=-1).view(self.out_features, self.in_features)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        n, k, gs = self.out_features, self.in_features, self.group_size
        q = self.codes().view(n, k // gs, gs).to(dtype)  # [N, G, gs]
        return (q * self.scales.to(dtype)[..., None] + self.minimums.to(dtype)[..., None]).view(n, k)

    def _kernel_tensors(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if self._kernel is None or self._kernel[0] != device:
            q = self.codes().to(torch.int32)  # [N, K]
            tiles = pick_inner_k_tiles(self.in_features)
            if device.type == "cpu":
                weight = torch._convert_weight_to_int4pack_for_cpu(q, tiles)
            else:
                # The CUDA converter takes two codes per byte with the even k in the high nibble.
                hi_lo = ((q[:, 0::2] << 4) | q[:, 1::2]).to(torch.uint8).to(device)
                weight = torch._convert_weight_to_int4pack(hi_lo, tiles)
            # tinygemm dequantizes (q - 8) * scale + zero, so zero = minimum + 8 * scale.
            zeros = self.minimums + 8.0 * self.scales  # [N, G]
            sz = torch.stack([self.scales, zeros], dim=-1).transpose(0, 1).contiguous()  # [G, N, 2]
            self._kernel = (device, weight, sz.to(device=device, dtype=KERNEL_DTYPE))
        return self._kernel[1], self._kernel[2]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)  # [M, K]
        # The CUDA tinygemm kernel has no row limit worth keeping; the CPU one loses beyond a few rows.
        if self.use_kernel and (x.device.type == "cuda" or x2.shape[0] <= KERNEL_MAX_ROWS):
            weight, sz = self._kernel_tensors(x.device)
            kd = KERNEL_DTYPE
            if x.device.type == "cpu":
                y = torch._weight_int4pack_mm_for_cpu(x2.to(kd), weight, self.group_size, sz)
            else:
                y = torch._weight_int4pack_mm(x2.to(kd), weight, self.group_size, sz)
            y = y.to(x.dtype)
        else:
            y = F.linear(x2, self.dequantize(x.dtype))
        return _finish(y, self.bias, lead)

    def kernel_bytes(self) -> int:
        """Bytes one decode step reads for this layer: 4-bit codes plus the scale/zero table."""
        return self.packed.numel() + self.scales.numel() * 2 * 2

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, group_size={self.group_size}, kernel={self.use_kernel}"


def quantize_linear(linear: nn.Linear, scheme: Scheme, *, group_size: int = 32, use_kernel: bool = True) -> nn.Module:
    if scheme == "int8":
        return Int8WeightOnlyLinear.from_float(linear.weight, linear.bias, use_kernel=use_kernel)
    if scheme == "int4":
        return Int4WeightOnlyLinear.from_float(linear.weight, linear.bias, group_size=group_size, use_kernel=use_kernel)
    raise ValueError(f"quant scheme must be one of {SCHEMES}, got {scheme!r}")


def quantize_model(
    model: nn.Module,
    scheme: Scheme,
    *,
    group_size: int = 32,
    use_kernel: bool = True,
    replacements: dict[str, nn.Module] | None = None,
    head: bool = True,
) -> nn.Module:
    """Swap the projection Linears of every block in place, and (head=True) the output head for an int8 one
    (or for replacements["lm_head"], a GGUF's own 4-bit head).

    The head is int8 per channel whatever the scheme, as llama.cpp's Q4_1 files keep it (Q8_0): it is the
    largest single matrix a decode step reads (vocab x hidden), and 4 bits there cost more accuracy than
    anywhere else. A tied head gets its own int8 copy; the embedding rows stay float for the lookup.
    `replacements` maps a module path ("layers.3.mlp.up_proj") to a ready quantized layer (GGUF blocks);
    the rest are quantized from their float weights. Returns the same model.
    """
    if scheme not in SCHEMES:
        raise ValueError(f"quant scheme must be one of {SCHEMES}, got {scheme!r}")
    if scheme == "none":
        return model
    replacements = replacements or {}
    # the model's device; a layer a replacement takes may still be on "meta" (loader.load_gguf_quantized)
    device = next((p.device for p in model.parameters() if p.device.type != "meta"), torch.device("cpu"))
    for path, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if child_name not in _LINEAR_NAMES or not isinstance(child, nn.Linear):
                continue
            full = f"{path}.{child_name}" if path else child_name
            new = replacements.get(full) or quantize_linear(child, scheme, group_size=group_size, use_kernel=use_kernel)
            if child.bias is not None and new.bias is None:
                new.bias = child.bias.detach().clone()  # GGUF keeps biases as separate float tensors
            setattr(module, child_name, new.to(device))
    if head and "lm_head" in replacements:
        model.lm_head = replacements["lm_head"].to(device)  # type: ignore[assignment]
    elif head:
        quantize_head(model, use_kernel=use_kernel)
    return model


def quantize_head(model: nn.Module, *, use_kernel: bool = True) -> None:
    """model.lm_head <- int8 per-channel copy of the head (or of the tied embedding); no-op if already quantized."""
    current = getattr(model, "lm_head", None)
    if current is not None and not isinstance(current, nn.Linear):
        return
    weight = model.embed_tokens.weight if current is None else current.weight
    model.lm_head = Int8Head.from_float(weight, use_kernel=use_kernel)


def weight_bytes_per_token(model: nn.Module) -> int:
    """Bytes of weights one decode step reads: every projection plus the output head (not the embedding rows)."""
    total = 0
    for m in model.modules():
        if isinstance(m, Int4WeightOnlyLinear):
            total += m.kernel_bytes()
        elif isinstance(m, Int8WeightOnlyLinear):
            total += m.qweight.numel() + m.scales.numel() * 2
        elif isinstance(m, nn.Linear):
            total += m.weight.numel() * m.weight.element_size()
    head = getattr(model, "lm_head", None)
    if head is None and hasattr(model, "embed_tokens"):
        total += model.embed_tokens.weight.numel() * model.embed_tokens.weight.element_size()
    return total
