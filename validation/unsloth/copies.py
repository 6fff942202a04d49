#!/usr/bin/env python3
"""The verbatim copies of Unsloth 2024.12.4 / unsloth_zoo 2024.12.1 in `validation/unsloth/copied/`:
which lines of which wheel file each holds, and the import lines written in place of the wheel's
(the only lines that are not the wheel's).

    python3 validation/unsloth/copies.py --check --unsloth DIR --zoo DIR    # compare with the wheels
    python3 validation/unsloth/copies.py --write --unsloth DIR --zoo DIR    # (re)generate copied/*.py

DIR is where the wheel is unpacked (the folder holding `unsloth/` resp. `unsloth_zoo/`), e.g.
    pip download --no-deps unsloth==2024.12.4 unsloth_zoo==2024.12.1 -d /tmp/w
    cd /tmp/w && unzip -q -d u unsloth-2024.12.4-*.whl && unzip -q -d z unsloth_zoo-2024.12.1-*.whl
`--check` exits 1 unless every block between its `# >>>` and `# <<<` markers equals the wheel's
lines. Needs nothing but Python.
"""
from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "copied")

U = ("unsloth", "2024.12.4")
Z = ("unsloth_zoo", "2024.12.1")

# The decorators of the autograd functions follow CUDA's autocast (the lines above); the harness's GPU
# is the CPU device, its autocast the CPU one with CUDA's lists, so they are bound to "cpu" instead.
AUTOCAST_DEVICE = '''# Written here: the emulated GPU is the CPU device (validation/harness), whose autocast stands for
# CUDA's; the decorators the block above binds for device_type "cuda" are bound for "cpu".
torch_amp_custom_fwd = torch.amp.custom_fwd(device_type = "cpu")
torch_amp_custom_bwd = torch.amp.custom_bwd(device_type = "cpu")
'''

# Each file: a list of parts, either ("text", str) written as is (imports, stand-in bindings), or
# ("copy", package, path inside the wheel, first line, last line) copied verbatim (1-based, inclusive).
FILES = {
    "utils.py": [
        ("copy", U, "unsloth/kernels/utils.py", 1, 14),
        ("text", '''# Imports written here in place of the wheel's lines 15, 20-21, 62-73: `triton` (L15) and the
# bitsandbytes CUDA library (L62-73: get_ptr and the cdequantize_* C functions) are stand-ins
# (_standins.py); HAS_CUDA_STREAM is what L64 computes for bitsandbytes 0.50.2 (> 0.43.3); CUDA_STREAM
# is set so that fast_dequantize (L139-140) never asks torch.cuda for the current stream.
import torch
import ctypes
from packaging.version import Version
from ._standins import triton
from ._standins import (get_ptr, cdequantize_blockwise_fp32, cdequantize_blockwise_fp16_nf4,
                        cdequantize_blockwise_bf16_nf4, STREAM)
HAS_CUDA_STREAM = True
CUDA_STREAM = STREAM
'''),
        ("copy", U, "unsloth/kernels/utils.py", 16, 17),
        ("copy", U, "unsloth/kernels/utils.py", 19, 28),
        ("text", AUTOCAST_DEVICE),
        ("copy", U, "unsloth/kernels/utils.py", 49, 59),
        ("copy", U, "unsloth/kernels/utils.py", 76, 220),
        ("copy", U, "unsloth/kernels/utils.py", 400, 422),
    ],
    "swiglu.py": [
        ("copy", U, "unsloth/kernels/swiglu.py", 1, 14),
        ("text", '''# Imports written here in place of the wheel's lines 15-18; the two @triton.jit kernels
# (L21-38 `_fg_kernel`, L51-90 `_DWf_DW_dfg_kernel`) are stand-ins (_standins.py).
import torch
from ._standins import triton, _fg_kernel, _DWf_DW_dfg_kernel
from .utils import calculate_settings
'''),
        ("copy", U, "unsloth/kernels/swiglu.py", 41, 48),
        ("copy", U, "unsloth/kernels/swiglu.py", 93, 99),
    ],
    "rms_layernorm.py": [
        ("copy", U, "unsloth/kernels/rms_layernorm.py", 1, 14),
        ("text", '''# Imports written here in place of the wheel's lines 15-18; the @triton.jit kernels (L21-53
# `_rms_layernorm_forward`, L56-99 `_rms_layernorm_backward`, L102-132 `_gemma_rms_layernorm_forward`)
# are stand-ins (_standins.py).
import torch
from ._standins import _rms_layernorm_forward, _rms_layernorm_backward, _gemma_rms_layernorm_forward
from .utils import calculate_settings
'''),
        ("copy", U, "unsloth/kernels/rms_layernorm.py", 135, 208),
    ],
    "rope_embedding.py": [
        ("copy", U, "unsloth/kernels/rope_embedding.py", 1, 14),
        ("text", '''# Imports written here in place of the wheel's lines 15-18; the @triton.jit kernel (L21-71
# `_rope_embedding`) is a stand-in (_standins.py).
import torch
from ._standins import _rope_embedding
from .utils import calculate_settings
'''),
        ("copy", U, "unsloth/kernels/rope_embedding.py", 19, 19),
        ("copy", U, "unsloth/kernels/rope_embedding.py", 74, 196),
    ],
    "fast_lora.py": [
        # the wheel's own imports (L15-24) run as they are: .utils is the copy above
        ("copy", U, "unsloth/kernels/fast_lora.py", 1, 169),
        ("copy", U, "unsloth/kernels/fast_lora.py", 201, 412),
    ],
    "gradient_checkpointing.py": [
        ("copy", Z, "unsloth_zoo/gradient_checkpointing.py", 1, 16),
        ("text", '''# Imports written here in place of the wheel's lines 26-30 (numpy and os are used only by
# code not copied).
import torch
from packaging.version import Version
'''),
        ("copy", Z, "unsloth_zoo/gradient_checkpointing.py", 50, 57),
        ("text", AUTOCAST_DEVICE),
        ("copy", Z, "unsloth_zoo/gradient_checkpointing.py", 145, 174),
    ],
    "llama.py": [
        ("copy", U, "unsloth/models/llama.py", 1, 14),
        ("text", '''# Imports written here in place of the wheel's lines 15-68 (`from ._utils import *`,
# `from ..kernels import *`, transformers' Llama classes, peft, triton): the names the copied
# functions read. The kernels are the copies in this package; xformers' names, flash_attn_func and
# the inference-only helpers are stand-ins (_standins.py). HAS_FLASH_ATTENTION is set by the recipe
# (measure_unsloth.py: True, the flash-attn branch of LlamaAttention_fast_forward, L415-419).
import torch
import math
import os
from math import sqrt as math_sqrt
from typing import Optional, Tuple, List, Union
from torch.nn.functional import scaled_dot_product_attention
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.utils import logging as _hf_logging
from .rms_layernorm import fast_rms_layernorm
from .rope_embedding import fast_rope_embedding, inplace_rope_embedding
from .gradient_checkpointing import Unsloth_Offloaded_Gradient_Checkpointer
from ._standins import (xformers, xformers_attention, flash_attn_func, fast_rms_layernorm_inference,
                        fast_rms_layernorm_inference_gemma, fast_swiglu_inference,
                        _prepare_4d_causal_attention_mask_for_sdpa, create_flex_attention_causal_mask,
                        create_flex_attention_sliding_window_mask)
logger = _hf_logging.get_logger("transformers.models.llama.modeling_llama")
HAS_FLASH_ATTENTION = True
HAS_FLASH_ATTENTION_SOFTCAPPING = False
HAS_FLEX_ATTENTION = False
'''),
        ("copy", U, "unsloth/models/llama.py", 329, 527),
        ("copy", U, "unsloth/models/llama.py", 529, 872),
        ("copy", U, "unsloth/models/llama.py", 1120, 1189),
        ("copy", U, "unsloth/models/llama.py", 1221, 1315),
    ],
}

INIT = '''"""Unsloth 2024.12.4 (and unsloth_zoo 2024.12.1) pure-PyTorch code, copied verbatim from the wheels;
see validation/unsloth/copies.py for which lines and validation/unsloth/copied/_standins.py for what
replaces the Triton kernels, bitsandbytes' CUDA library and flash-attn. Generated by copies.py --write."""
'''


def _begin(pkg, path, a, b):
    return f"# >>> {pkg[0]} {pkg[1]} {path} L{a}-L{b} (verbatim)\n"


def _end(pkg, path, a, b):
    return f"# <<< {pkg[0]} {pkg[1]} {path} L{a}-L{b}\n"


def _src_lines(roots, pkg, path):
    with open(os.path.join(roots[pkg[0]], path), encoding="utf-8") as f:
        return f.read().split("\n")


def render(name, roots):
    out = [f"# Generated by validation/unsloth/copies.py from {U[0]} {U[1]} / {Z[0]} {Z[1]}: the blocks between\n"
           "# `# >>>` and `# <<<` are the wheel's lines, unchanged; the rest are the imports written in their place.\n"]
    for part in FILES[name]:
        if part[0] == "text":
            out.append(part[1])
            continue
        _, pkg, path, a, b = part
        lines = _src_lines(roots, pkg, path)[a - 1:b]
        out.append(_begin(pkg, path, a, b))
        out.append("\n".join(lines) + "\n")
        out.append(_end(pkg, path, a, b))
    return "".join(out)


def check(roots):
    bad = 0
    for name, parts in FILES.items():
        with open(os.path.join(OUT, name), encoding="utf-8") as f:
            text = f.read()
        for part in parts:
            if part[0] != "copy":
                continue
            _, pkg, path, a, b = part
            begin, end = _begin(pkg, path, a, b), _end(pkg, path, a, b)
            i = text.find(begin)
            j = text.find(end, i + 1)
            if i < 0 or j < 0:
                print(f"{name}: block {path} L{a}-L{b} not found", file=sys.stderr)
                bad += 1
                continue
            have = text[i + len(begin):j]
            want = "\n".join(_src_lines(roots, pkg, path)[a - 1:b]) + "\n"
            ok = have == want
            bad += not ok
            print(f"{'ok  ' if ok else 'DIFF'} {name:28s} <- {pkg[0]} {pkg[1]} {path} L{a}-L{b} "
                  f"({b - a + 1} lines)")
    return 1 if bad else 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--unsloth", required=True, help="folder holding the unpacked unsloth 2024.12.4 wheel's unsloth/")
    ap.add_argument("--zoo", required=True, help="folder holding the unpacked unsloth_zoo 2024.12.1 wheel's unsloth_zoo/")
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--check", action="store_true")
    g.add_argument("--write", action="store_true")
    a = ap.parse_args(argv)
    roots = {U[0]: a.unsloth, Z[0]: a.zoo}
    if a.check:
        return check(roots)
    os.makedirs(OUT, exist_ok=True)
    for name in FILES:
        with open(os.path.join(OUT, name), "w", encoding="utf-8") as f:
            f.write(render(name, roots))
    with open(os.path.join(OUT, "__init__.py"), "w", encoding="utf-8") as f:
        f.write(INIT)
    return check(roots)


if __name__ == "__main__":
    sys.exit(main())
