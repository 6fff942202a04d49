#!/usr/bin/env python3
"""Derive Unsloth's published QLoRA context tables from source (UNSLOTH.md sections 7-9).

One Unsloth QLoRA step: batch 1, r = 32, LoRA on all 7 linears, bf16, "unsloth" offloaded
gradient checkpointing, Llama 3.1 8B and Llama 3.3 70B.  GPU memory of the step is written as
persistent bytes + bytes/token x N (plus the few step-constant transients that source shows),
then solved for the longest N that fits in each published card size.

Nothing here is fitted to the published tables: every term is an architecture product with a
source reference in UNSLOTH.md.  Plain Python 3, no third-party imports.

Counter assumption: the peak is the sum of live tensor bytes (what torch.cuda.max_memory_allocated
reports), compared with the *whole* card ("GPU VRAM" = total device memory).  The CUDA context,
cuBLAS/Triton workspaces and allocator slack are NOT counted, so our N is an upper bound for the
same formula.  "GB" is read both as 10**9 and as 2**30 bytes.
"""

import math

GB, GIB = 10**9, 2**30
S = 2          # bf16
R = 32         # LoRA rank (published runs)
BNB_BLOCK = 64 # "our pre-quants use blocksize = 64" (loader.py#L400)

MODELS = {
    "Llama 3.1 8B": dict(h=4096, L=32, nh=32, nkv=8, d=128, f=14336, V=128256, max_pos=131072),
    "Llama 3.3 70B": dict(h=8192, L=80, nh=64, nkv=8, d=128, f=28672, V=128256, max_pos=131072),
}

PUBLISHED = {  # UNSLOTH.md section 6 (README L380-407, blog llama3-3)
    "Llama 3.1 8B": [(8, 2972), (12, 21848), (16, 40724), (24, 78475), (40, 153977), (48, 191728), (80, 342733)],
    "Llama 3.3 70B": [(48, 12106), (80, 89389)],
}
PUBLISHED_ZERO = {"Llama 3.1 8B": 7.37, "Llama 3.3 70B": 42.99}  # section 6, in the table's "GB"


def ceil_to(n, m):
    return -(-n // m) * m


def linears(m):
    """(in, out) of the 7 adapted linears of one decoder layer."""
    h, q, k, f = m["h"], m["nh"] * m["d"], m["nkv"] * m["d"], m["f"]
    return [(h, q), (h, k), (h, k), (q, h), (h, f), (h, f), (f, h)]


def persistent_terms(m, era, optim):
    """Bytes alive for the whole step, independent of N (section 7; Dec 2024 differences in section 8)."""
    h, L, V, d = m["h"], m["L"], m["V"], m["d"]
    n4 = L * sum(i * o for i, o in linears(m))
    n_lora = L * sum(R * (i + o) for i, o in linears(m))
    n_lora_tensors = L * 7 * 2
    t = {}
    # bnb NF4 double quant: 0.5 B + uint8 absmax per 64 + fp32 absmax2 per 64*256 (section 7)
    t["4-bit linears (0.51587 B/param)"] = n4 * (0.5 + 1 / BNB_BLOCK + 4 / (BNB_BLOCK * 256))
    t["embed_tokens + lm_head (bf16, untied)"] = 2 * S * V * h
    t["RMSNorm weights (bf16)"] = S * h * (2 * L + 1)
    t["LoRA A/B fp32"] = 4 * n_lora
    t["LoRA grads fp32"] = 4 * n_lora
    if optim == "adamw_8bit":
        # bnb blockwise 8-bit: 2 uint8 states + fp32 absmax per <=256-element block (upper bound),
        # plus two 256-entry fp32 quantile maps per tensor
        t["AdamW 8-bit states (bnb)"] = n_lora * (2 + 2 * 4 / 256) + n_lora_tensors * 2 * 256 * 4
    else:
        t["AdamW fp32 states"] = 8 * n_lora
    if era == "dec2024":
        # model-level LlamaRotaryEmbedding: min(32768, max_pos) rows; default dtype is bf16 during
        # from_pretrained (transformers 4.47 modeling_utils.py L4070 _set_default_torch_dtype)
        t["model-level RoPE cache (32768 rows bf16)"] = 2 * min(32768, m["max_pos"]) * d * S
        # zoo 2024.12.1 has no GPU GC buffer (Unsloth_Offloaded_Gradient_Checkpointer, section 8.1)
    else:
        t["dequant global buffer (s*h*f + fp32 absmax)"] = S * h * m["f"] + 4 * h * m["f"] / BNB_BLOCK
        # GC GPU buffer s*max(N*h, 2^20) is the "shared buffer h" of the per-token term; 2 MiB floor only
        t["GC GPU buffer floor (2 MiB)"] = 2 * 2**20
    return t


def dequant_temp(m):
    """One fresh dequantized weight (largest linear h*f) plus its fp32 absmax (utils.py fast_dequantize)."""
    return S * m["h"] * m["f"] + 4 * m["h"] * m["f"] / BNB_BLOCK


def rope_layers_dec2024(m, N):
    """Per-layer LlamaExtendedRotaryEmbedding caches (section 8.2 b): built at min(32768, max_pos)
    rows in bf16, grown in 8192-row steps to the sequence length."""
    rows = max(min(32768, m["max_pos"]), ceil_to(N, 8192))
    return m["L"] * 2 * rows * m["d"] * S


def rope_2026(m, N):
    """One cache per GPU grown to max_position_embeddings = max(max_seq_length, model max) (section 5)."""
    return 2 * ceil_to(max(N, m["max_pos"]), 8192) * m["d"] * S


def slope_dec2024(m):
    """Section 8.3 without the RoPE term (handled exactly, with rounding, in rope_layers_dec2024)."""
    h, q, k, f = m["h"], m["nh"] * m["d"], m["nkv"] * m["d"], m["f"]
    return S * (7 * h + 2 * q + 2 * k + 4 * f + R) + 4 * m["nh"] + 32


def slope_2026(m):
    """Section 7 s(6h+2q+2k+3f) + 4(2+n_heads) + embedding leaf s*h (8.2 c) + X@A s*r + int64 batch 24."""
    h, q, k, f = m["h"], m["nh"] * m["d"], m["nkv"] * m["d"], m["f"]
    return S * (7 * h + 2 * q + 2 * k + 3 * f + R) + 4 * (2 + m["nh"]) + 24


def peak_dec2024(m, N, optim):
    pt = persistent_terms(m, "dec2024", optim)
    P = sum(pt.values())
    grads = pt["LoRA grads fp32"]
    rope = rope_layers_dec2024(m, N)
    h, f = m["h"], m["f"]
    a = slope_dec2024(m) - S * (f + R)  # live set without the matmul_lora temp and X@A
    # MLP backward, matmul_lora(dY, downW^T): max over "W dequantized" and "LoRA temp" instants
    layer = P + rope + max(a * N + dequant_temp(m), slope_dec2024(m) * N)
    # CCE backward (before any layer backward; LoRA grads of this step not yet allocated):
    # dc = zeros_like(lm_head) V*h*s, de/e/final-norm X/embedding leaf 4*s*h, lse/neg_dot/valids/r/batch
    loss = P - grads + rope + S * m["V"] * h + (4 * S * h + 44) * N
    return max(layer, loss)


def peak_2026(m, N, optim):
    P = sum(persistent_terms(m, "2026", optim).values())
    # chunked fused CE sizes its chunk to ~half the free memory at first call: not N-limiting, not modelled
    return P + rope_2026(m, N) + slope_2026(m) * N + dequant_temp(m)


def longest(peak, m, cap, optim):
    lo, hi = 0, 1
    if peak(m, 1, optim) > cap:
        return 0
    while peak(m, hi, optim) <= cap:
        hi *= 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if peak(m, mid, optim) <= cap else (lo, mid)
    return lo


def pct(ours, pub):
    return f"{100 * (ours - pub) / pub:+.1f}%"


def main():
    within = {}
    for name, m in MODELS.items():
        print(f"### {name}\n")
        for era in ("dec2024", "2026"):
            for optim in ("adamw_8bit", "adamw_fp32"):
                pt = persistent_terms(m, era, optim)
                if optim == "adamw_8bit" and era == "dec2024":
                    for k, v in pt.items():
                        print(f"- {k}: {v / GB:.3f} GB")
                print(f"- persistent, {era}, {optim}: {sum(pt.values()) / GB:.3f} GB = {sum(pt.values()) / GIB:.3f} GiB")
        print(f"- dequant temp (largest linear + absmax): {dequant_temp(m) / GB:.3f} GB; "
              f"CCE dc (V*h*s): {S * m['V'] * m['h'] / GB:.3f} GB")
        rope_pt = 2 * S * m["d"] * m["L"]
        print(f"- B/token Dec 2024 (8.3, flash): {slope_dec2024(m) + rope_pt:,} "
              f"(of which per-layer RoPE {rope_pt:,}, rows rounded up to 8192, floor 32768 rows)")
        print(f"- B/token 2026 (7 + embedding leaf): {slope_2026(m):,}")
        # published zero-intercept vs ours (large-N asymptote = persistent + model-level constants)
        z = PUBLISHED_ZERO[name]
        for optim in ("adamw_8bit", "adamw_fp32"):
            P = sum(persistent_terms(m, "dec2024", optim).values())
            print(f"- intercept: published {z} 'GB' = {z * GB / 1e9:.2f}e9 or {z * GIB / 1e9:.2f}e9 B; "
                  f"ours Dec 2024 {optim} {P / 1e9:.2f}e9 B "
                  f"({pct(P, z * GB)} vs 10^9, {pct(P, z * GIB)} vs 2^30)")
        print()
        for optim in ("adamw_8bit", "adamw_fp32"):
            print(f"{name}, optimizer {optim}:\n")
            print("| GPU | published | Dec 2024 10^9 | err | Dec 2024 2^30 | err | 2026 10^9 | err | 2026 2^30 | err |")
            print("|---|---|---|---|---|---|---|---|---|---|")
            for gb, pub in PUBLISHED[name]:
                row = [f"{gb} GB", f"{pub:,}"]
                for peak in (peak_dec2024, peak_2026):
                    for unit in (GB, GIB):
                        n = longest(peak, m, gb * unit, optim)
                        row += [f"{n:,}", pct(n, pub)]
                        key = (optim, peak.__name__, unit)
                        within.setdefault(key, [0, 0])
                        within[key][1] += 1
                        within[key][0] += abs(n - pub) <= 0.10 * pub
                print("| " + " | ".join(row) + " |")
            print()
    print("Rows within 10% (both models, 9 rows):\n")
    for (optim, p, unit), (ok, tot) in within.items():
        era = "Dec 2024" if p == "peak_dec2024" else "2026"
        print(f"- {optim}, {era}, GB = {'10^9' if unit == GB else '2^30'}: {ok}/{tot}")


if __name__ == "__main__":
    main()
