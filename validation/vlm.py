#!/usr/bin/env python3
"""Measure one fine-tuning step of a vision-language model (images + text): the recipe of the
harness (validation/harness/: FakeTensorMode on the CPU with CUDA emulated, the tracker's phases,
one untracked warm-up step, the row format) that varies the images, the family's processor and
which of tower / projector / language model is trained.
See validation/VLM.md for the token arithmetic, what each tower keeps for backward and the rows.

Families (transformers 5.24 classes, built from the config with random weights):
  qwen2_5_vl  Qwen2_5_VLForConditionalGeneration  dynamic resolution (smart_resize), 14-px patches,
              temporal patch 2, 2x2 merge, window attention + full-attention blocks, mrope
  qwen3_vl    Qwen3VLForConditionalGeneration     16-px patches, learned interpolated position
              embedding, deepstack mergers feeding the first LM layers
  gemma3      Gemma3ForConditionalGeneration       SigLIP 896x896 (4096 patches), 4x4 avg pool -> 256
              tokens; bidirectional attention over each image's tokens (token_type_ids)
  smolvlm / idefics3  SmolVLM/Idefics3ForConditionalGeneration  image splitting into
              max_image_size tiles + a global image, pixel shuffle connector
  llava_next  LlavaNextForConditionalGeneration    CLIP tower, anyres grid + unpadding, image_newline
  mllama      MllamaForConditionalGeneration       tiled 560x560 vision encoder, cross-attention layers

Options: --vision frozen|trained, --projector trained|frozen, --gc, --lora-r R (peft LoRA on the LM's
decoder-layer Linears, fp32 adapters; otherwise the LM is fully trained).

The inputs are what the model's processor returns for `--images` images of `--image-size W H` per
sample and `--text-tokens` text tokens: input_ids with the processor's placeholder / markup tokens,
pixel_values (fp32) of the processor's shape, and the extra tensors (image_grid_thw +
mm_token_type_ids, token_type_ids, pixel_attention_mask, image_sizes, aspect_ratio_ids/mask,
cross_attention_mask). The token arithmetic reproduces the processors (checked against the real
image processors with --check-processors). Labels = input ids with the image placeholders set to
-100; no attention_mask (no padding), as in the text rows.

Data-dependent code (cu_seqlens splits, window indices, rope index, placeholder masks, padding-image
removal) runs on fake *constant* tensors: the index inputs carry their real values
(FakeTensorConverter make_constant) and torch's constant propagation is allowed up to 2**26
elements, so `.tolist()` / boolean indexing see the same values as on a GPU while every tensor is
still a fake tensor counted by MemTracker. `masked_select` with a constant mask (the backward of
masked_scatter) gets its true output size.

Example:
  python validation/vlm.py --config validation/configs/qwen2.5-vl-7b-4l.json --model-name qwen2.5-vl-7b-4l \\
      --batch 1 --images 1 --image-size 448 448 --text-tokens 256 --precision bf16 --vision frozen \\
      --projector trained --out rows.jsonl
  python validation/vlm.py --grid validation/grid-vlm.json --out core/tests/fixtures/vlm-measured.jsonl
  python validation/vlm.py --from-row "$(sed -n 1p core/tests/fixtures/vlm-measured.jsonl)"  # one row again
  python validation/vlm.py --check-processors        # token arithmetic vs the real image processors
  python validation/vlm.py --dump ... (same options)  # saved-for-backward tensors by module
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as H  # noqa: E402

import torch  # noqa: E402
from torch._subclasses import fake_impls as _FI  # noqa: E402
from torch._subclasses import fake_tensor as _FT  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.utils._python_dispatch import _disable_current_modes  # noqa: E402

CONST_LIMIT = 1 << 26


# ----------------------------------------------------------------------------------------------
# Fake-mode support for data-dependent multimodal code
# ----------------------------------------------------------------------------------------------
_INSTALLED = False
_FAKE = {"mode": None}


def install():
    """The harness's CUDA emulation + what the multimodal models need under FakeTensorMode."""
    global _INSTALLED
    H.install_cuda_emulation()
    if _INSTALLED:
        return
    H.install_frozen_param_hook_guard()  # frozen towers, projectors, LoRA's base weights
    # constant propagation for the index tensors (grid_thw, input_ids, masks)
    _FT.CONSTANT_NUMEL_LIMIT = CONST_LIMIT
    orig_ms = _FI.op_implementations_dict[torch.ops.aten.masked_select.default]

    def masked_select(fake_mode, func, self, mask):
        c = getattr(mask, "constant", None)
        if c is not None:
            shape = torch.broadcast_shapes(self.shape, mask.shape)
            return self.new_empty((int(c.expand(shape).sum()),))
        return orig_ms(fake_mode, func, self, mask)

    _FI.op_implementations_dict[torch.ops.aten.masked_select.default] = masked_select
    # A vision tower's bidirectional mask from an all-True patch mask (Idefics3 / SmolVLM) is dropped
    # on a GPU (`padding_mask.all()`, then SDPA without a mask); transformers never reads the values
    # of a fake tensor ("tracing") and would materialise it. Decide on the constant's real values.
    import transformers.masking_utils as mu
    orig_bi = mu._ignore_bidirectional_mask_sdpa

    def ignore_bidirectional(padding_mask, kv_length, local_attention_size=None):
        c = getattr(padding_mask, "constant", None) if padding_mask is not None else None
        if padding_mask is not None and c is None:
            return orig_bi(padding_mask, kv_length, local_attention_size)
        return (padding_mask is None or bool(c.all())) and (
            local_attention_size is None or kv_length < local_attention_size)

    mu._ignore_bidirectional_mask_sdpa = ignore_bidirectional
    _INSTALLED = True


def const(t):
    """A fake tensor that carries the real values of `t` (constant propagation)."""
    fm = _FAKE["mode"]
    return fm.fake_tensor_converter.from_real_tensor(fm, t, make_constant=True)


def _real(x):
    if isinstance(x, torch.Tensor) and getattr(x, "constant", None) is not None:
        return x.constant
    return x


def real_then_const(fn):
    """Run a data-dependent helper on the real values of its (constant) tensor arguments, outside
    every dispatch mode, and return fake constants. Each result is cloned inside the modes so that
    MemTracker sees the device allocation the helper makes on a GPU."""
    def wrapper(*args, **kwargs):
        a = [_real(x) for x in args]
        kw = {k: _real(v) for k, v in kwargs.items() if k != "kwargs"}
        with _disable_current_modes():
            out = fn(*a, **kw)

        def back(o):
            if isinstance(o, torch.Tensor):
                return const(o).clone()
            if isinstance(o, tuple):
                return tuple(back(x) for x in o)
            if isinstance(o, list):
                return [back(x) for x in o]
            return o
        return back(out)
    return wrapper


# ----------------------------------------------------------------------------------------------
# Config
# ----------------------------------------------------------------------------------------------
PRE_KEY = "preprocessor_config"


def load_vlm_config(path, attn):
    import transformers
    with open(path) as f:
        d = json.load(f)
    pre = d.get(PRE_KEY, {})
    d = {k: v for k, v in d.items() if not k.startswith("_") and k != PRE_KEY}
    mt = d.pop("model_type")
    for k in ("transformers_version", "torch_dtype", "dtype"):
        d.pop(k, None)
    cfg = transformers.AutoConfig.for_model(mt, **d)
    cfg.use_cache = False
    try:
        cfg.get_text_config().use_cache = False
    except Exception:
        pass
    arch = (d.get("architectures") or [None])[0]
    return cfg, arch, pre


# ----------------------------------------------------------------------------------------------
# Families: processor token arithmetic, inputs, tower / projector modules
# ----------------------------------------------------------------------------------------------
class Family:
    """One image: `layout(W, H)` -> dict(patches=patches entering the tower, tokens=LM placeholder
    tokens, markup=list of extra text tokens the processor adds, ...)."""
    name = "?"
    text_id = 1000

    def __init__(self, cfg, pre):
        self.cfg, self.pre = cfg, pre

    def image_token_id(self):
        return self.cfg.image_token_id

    def sample_ids(self, lays, text_tokens):
        """Token ids of one sample: a short text prefix, each image (markup + placeholders), the
        rest of the text."""
        pre = min(16, text_tokens)
        ids = [self.text_id] * pre
        for lay in lays:
            ids += self.image_ids(lay)
        ids += [self.text_id] * (text_tokens - pre)
        return ids

    def extra_inputs(self, batch, lays, ids):
        return {}

    def text_only_inputs(self, batch, ids):
        """What the processor returns beside the ids for a text-only batch (`--images 0`): no
        pixel values, no image-side tensors."""
        return {}

    def patch(self, model):
        pass


def qwen_smart_resize(height, width, factor, min_pixels, max_pixels):
    """Qwen2VLImageProcessor's smart_resize (transformers 5.24
    models/qwen2_vl/image_processing_pil_qwen2_vl.py smart_resize)."""
    if max(height, width) / min(height, width) > 200:
        raise ValueError("absolute aspect ratio must be smaller than 200")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


class QwenVL(Family):
    name = "qwen_vl"

    def __init__(self, cfg, pre):
        super().__init__(cfg, pre)
        vc = cfg.vision_config
        self.p = pre.get("patch_size", vc.patch_size)
        self.m = pre.get("merge_size", vc.spatial_merge_size)
        self.tp = pre.get("temporal_patch_size", vc.temporal_patch_size)
        size = pre.get("size", {})
        self.min_pixels = pre.get("min_pixels", size.get("shortest_edge", 56 * 56))
        self.max_pixels = pre.get("max_pixels", size.get("longest_edge", 28 * 28 * 1280))

    def layout(self, W, H):
        h, w = qwen_smart_resize(H, W, self.p * self.m, self.min_pixels, self.max_pixels)
        gh, gw = h // self.p, w // self.p
        return {"resized": [w, h], "grid_thw": [1, gh, gw], "patches": gh * gw,
                "tokens": gh * gw // (self.m ** 2), "markup": 2}

    def image_ids(self, lay):
        c = self.cfg
        return [c.vision_start_token_id] + [c.image_token_id] * lay["tokens"] + [c.vision_end_token_id]

    def pixel_spec(self, batch, lays):
        n = batch * sum(l["patches"] for l in lays)
        return {"pixel_values": ("randn", (n, 3 * self.tp * self.p * self.p), torch.float32)}

    def extra_inputs(self, batch, lays, ids):
        grid = torch.tensor([l["grid_thw"] for l in lays] * batch, dtype=torch.long)
        mmt = (ids == self.cfg.image_token_id).long()
        return {"image_grid_thw": grid, "mm_token_type_ids": mmt}

    def text_only_inputs(self, batch, ids):
        # the processor returns mm_token_type_ids with or without images (all 0 here)
        return {"mm_token_type_ids": torch.zeros_like(ids)}

    def tower(self, model):
        v = model.model.visual
        skip = {"merger", "deepstack_merger_list"}
        return [m for n, m in v.named_children() if n not in skip]

    def projector(self, model):
        v = model.model.visual
        return [m for n, m in v.named_children() if n in ("merger", "deepstack_merger_list")]

    def patch(self, model):
        import importlib
        mod = importlib.import_module(type(model).__module__)
        # window indices (Qwen2.5-VL) and the 3D rope index: loops over grid_thw / input_ids values
        if hasattr(mod, "get_vision_window_index") and not getattr(mod.get_vision_window_index, "_vlm", False):
            f = real_then_const(mod.get_vision_window_index)
            f._vlm = True
            mod.get_vision_window_index = f
        inner = model.model
        inner.get_rope_index = real_then_const(inner.get_rope_index)


class Gemma3(Family):
    name = "gemma3"
    nl2 = 108  # "\n\n" in the Gemma 3 tokenizer

    def layout(self, W, H):
        vc = self.cfg.vision_config
        s = self.pre.get("size", {}).get("height", vc.image_size)
        if s != vc.image_size:
            raise ValueError("Gemma 3's image processor must resize to the tower's image_size")
        return {"resized": [s, s], "patches": (s // vc.patch_size) ** 2,
                "tokens": self.cfg.mm_tokens_per_image, "markup": 4}

    def image_ids(self, lay):
        c = self.cfg
        return [self.nl2, c.boi_token_index] + [c.image_token_index] * lay["tokens"] + [c.eoi_token_index, self.nl2]

    def image_token_id(self):
        return self.cfg.image_token_index

    def pixel_spec(self, batch, lays):
        s = lays[0]["resized"][0]
        return {"pixel_values": ("randn", (batch * len(lays), 3, s, s), torch.float32)}

    def extra_inputs(self, batch, lays, ids):
        # Gemma3Processor returns token_type_ids (mm_token_type_ids renamed): 1 on image tokens
        return {"token_type_ids": (ids == self.cfg.image_token_index).long()}

    def text_only_inputs(self, batch, ids):
        return {"token_type_ids": torch.zeros_like(ids)}

    def tower(self, model):
        return [model.model.vision_tower]

    def projector(self, model):
        return [model.model.multi_modal_projector]


class Idefics3Like(Family):
    """SmolVLM / Idefics3: resize the longest edge to size.longest_edge, round both sides up to
    multiples of max_image_size, split into max_image_size tiles + one global image resized to
    max_image_size (image_processing_pil_smolvlm.py _preprocess / split_images /
    resize_for_vision_encoder; same in idefics3)."""
    name = "idefics3"
    MAX_IMAGE_SIZE = 4096
    nl = 198  # "\n"

    def __init__(self, cfg, pre):
        super().__init__(cfg, pre)
        self.L = pre.get("size", {}).get("longest_edge", 4 * 364)
        self.Mx = pre.get("max_image_size", {}).get("longest_edge", 364)
        self.split = pre.get("do_image_splitting", True)
        vc = cfg.vision_config
        self.tpt = int(((vc.image_size // vc.patch_size) ** 2) / (cfg.scale_factor ** 2))
        self.ppt = (self.Mx // vc.patch_size) ** 2
        if self.Mx != vc.image_size:
            raise ValueError("max_image_size must equal vision_config.image_size")

    @staticmethod
    def _rescale_to_max_len(height, width, max_len):
        aspect_ratio = width / height
        if width >= height:
            width = max_len
            height = int(width / aspect_ratio)
            if height % 2 != 0:
                height += 1
        elif height > width:
            height = max_len
            width = int(height * aspect_ratio)
            if width % 2 != 0:
                width += 1
        return max(height, 1), max(width, 1)

    @staticmethod
    def _below_upper_bound(height, width, max_len):
        aspect_ratio = width / height
        if width >= height and width > max_len:
            width = max_len
            height = int(width / aspect_ratio)
        elif height > width and height > max_len:
            height = max_len
            width = int(height * aspect_ratio)
        return max(height, 1), max(width, 1)

    def layout(self, W, H):
        if not self.split:
            return {"resized": [self.Mx, self.Mx], "rows": 0, "cols": 0, "tiles": 1,
                    "patches": self.ppt, "tokens": self.tpt, "markup": 3}
        h, w = self._rescale_to_max_len(H, W, self.L)
        h, w = self._below_upper_bound(h, w, self.MAX_IMAGE_SIZE)
        # resize_for_vision_encoder (on the resized image)
        ar = w / h
        Mx = self.Mx
        if w >= h:
            w2 = math.ceil(w / Mx) * Mx
            h2 = int(w2 / ar)
            h2 = math.ceil(h2 / Mx) * Mx
        else:
            h2 = math.ceil(h / Mx) * Mx
            w2 = int(h2 * ar)
            w2 = math.ceil(w2 / Mx) * Mx
        if h2 > Mx or w2 > Mx:
            rows = (h2 - Mx) // Mx + 1
            cols = (w2 - Mx) // Mx + 1
            tiles = rows * cols + 1
            markup = 2 * rows * cols + rows + 4
        else:
            rows = cols = 0
            tiles, markup = 1, 3
        return {"resized": [w2, h2], "rows": rows, "cols": cols, "tiles": tiles,
                "patches": tiles * self.ppt, "tokens": tiles * self.tpt, "markup": markup}

    def image_ids(self, lay):
        c = self.cfg
        img, fake = c.image_token_id, self.fake_id
        out = []
        if lay["rows"]:
            for r in range(lay["rows"]):
                for cc in range(lay["cols"]):
                    out += [fake, self.global_id + 1 + r * 6 + cc] + [img] * self.tpt
                out += [self.nl]
            out += [self.nl]
        out += [fake, self.global_id] + [img] * self.tpt + [fake]
        return out

    @property
    def fake_id(self):
        return self.cfg.image_token_id - 1  # <fake_token_around_image> 49189 (SmolVLM) / 128257-1

    @property
    def global_id(self):
        return self.pre.get("_global_img_token_id", 49152)

    def pixel_spec(self, batch, lays):
        n = sum(l["tiles"] for l in lays)
        s = self.Mx
        # pixel values must be non-zero (the model drops all-zero "padding images"): real ones
        return {"pixel_values": ("ones", (batch, n, 3, s, s), torch.float32),
                "pixel_attention_mask": ("ones", (batch, n, s, s), torch.long)}

    def tower(self, model):
        return [model.model.vision_model]

    def projector(self, model):
        return [model.model.connector]


def select_best_resolution(original_size, possible_resolutions):
    """image_processing_utils.select_best_resolution (transformers 5.24): (height, width) of the
    pinpoint that keeps the most of the image at the least wasted area."""
    original_height, original_width = original_size
    best_fit, max_eff, min_waste = None, 0, float("inf")
    for height, width in possible_resolutions:
        scale = min(width / original_width, height / original_height)
        dw, dh = int(original_width * scale), int(original_height * scale)
        eff = min(dw * dh, original_width * original_height)
        waste = width * height - eff
        if eff > max_eff or (eff == max_eff and waste < min_waste):
            max_eff, min_waste, best_fit = eff, waste, (height, width)
    return best_fit


class LlavaNext(Family):
    """LLaVA-NeXT anyres: best pinpoint resolution -> (bh/s)*(bw/s) tiles of s = crop size (336) +
    one base image (image_processing_pil_llava_next.py get_image_patches); LM tokens from
    LlavaNextProcessor._get_number_of_features (unpadded grid + one newline per row + base), minus 1
    for vision_feature_select_strategy "default" (processing_llava_next.py replace_image_token)."""
    name = "llava_next"

    def __init__(self, cfg, pre):
        super().__init__(cfg, pre)
        vc = cfg.vision_config
        self.s = pre.get("crop_size", {}).get("height", vc.image_size)
        self.ps = pre.get("patch_size", vc.patch_size)
        self.pinpoints = pre.get("image_grid_pinpoints", cfg.image_grid_pinpoints)
        self.extra_tok = pre.get("num_additional_image_tokens", 1)
        self.strategy = pre.get("vision_feature_select_strategy", cfg.vision_feature_select_strategy)

    def layout(self, W, H):
        bh, bw = select_best_resolution((H, W), self.pinpoints)
        tiles = (bh // self.s) * (bw // self.s) + 1
        ph = pw = self.s // self.ps
        sh, sw = bh // self.s, bw // self.s
        cur_h, cur_w = ph * sh, pw * sw
        if W / H > cur_w / cur_h:
            new_h = int(round(H * (cur_w / W), 7))
            cur_h -= ((cur_h - new_h) // 2) * 2
        else:
            new_w = int(round(W * (cur_h / H), 7))
            cur_w -= ((cur_w - new_w) // 2) * 2
        tokens = cur_h * cur_w + cur_h + ph * pw + self.extra_tok
        if self.strategy == "default":
            tokens -= 1
        per_tile = ph * pw + (1 if self.extra_tok else 0)  # + CLS
        return {"resized": [bw, bh], "tiles": tiles, "unpadded_grid": [cur_h, cur_w],
                "patches": tiles * per_tile, "tokens": tokens, "markup": 0}

    def image_ids(self, lay):
        return [self.cfg.image_token_id] * lay["tokens"]

    def pixel_spec(self, batch, lays):
        n = max(l["tiles"] for l in lays)
        return {"pixel_values": ("randn", (batch * len(lays), n, 3, self.s, self.s), torch.float32)}

    def extra_inputs(self, batch, lays, ids):
        # image_sizes (num_images, 2) = (height, width) of the original images
        return {"image_sizes": torch.tensor([[l["orig"][1], l["orig"][0]] for l in lays] * batch,
                                            dtype=torch.long)}

    def tower(self, model):
        return [model.model.vision_tower]

    def projector(self, model):
        out = [model.model.multi_modal_projector]
        if getattr(model.model, "image_newline", None) is not None:
            out.append(model.model.image_newline)
        return out


def mllama_optimal_canvas(image_height, image_width, max_image_tiles, tile_size):
    """image_processing_pil_mllama.get_optimal_tiled_canvas: the smallest upscaling canvas of
    (h, w) tiles with h * w <= max_image_tiles, else the largest downscaling one (least area on
    ties). Returns (canvas_height, canvas_width)."""
    arr = [(w, h) for w in range(1, max_image_tiles + 1) for h in range(1, max_image_tiles + 1)
           if w * h <= max_image_tiles]
    cands = []
    for a, b in arr:  # (rows, cols) in tiles as the processor reads them: (a*tile, b*tile) = (height, width)
        th, tw = a * tile_size, b * tile_size
        sh, sw = th / image_height, tw / image_width
        cands.append((sh if sw > sh else sw, th, tw))
    up = [c[0] for c in cands if c[0] >= 1]
    sel = min(up) if up else max(c[0] for c in cands if c[0] < 1)
    chosen = [(th, tw) for sc, th, tw in cands if sc == sel]
    return min(chosen, key=lambda x: x[0] * x[1])


class Mllama(Family):
    """Llama 3.2 Vision: the image is resized onto the best canvas of up to max_image_tiles 560x560
    tiles (image_processing_pil_mllama.py get_optimal_tiled_canvas), padded to max_image_tiles tiles
    (pack_images: pixel_values (B, images, max_image_tiles, 3, 560, 560)); the vision encoder runs
    every tile slot, padding tiles included, with (560/14)^2 + 1 = 1601 patches per tile padded to
    a multiple of 8 (1608). The LM sees ONE <|image|> token per image; the image reaches the text
    through the cross-attention layers (cross_attention_mask from processing_mllama.py
    get_cross_attention_token_mask / convert_sparse_cross_attention_mask_to_dense)."""
    name = "mllama"

    def __init__(self, cfg, pre):
        super().__init__(cfg, pre)
        vc = cfg.vision_config
        self.tile = pre.get("size", {}).get("height", vc.image_size)
        self.max_tiles = pre.get("max_image_tiles", vc.max_num_tiles)
        self.ppt = (vc.image_size // vc.patch_size) ** 2 + 1
        self.ppt8 = self.ppt + (8 - self.ppt % 8) % 8

    def layout(self, W, H):
        ch, cw = mllama_optimal_canvas(H, W, self.max_tiles, self.tile)
        nh, nw = ch // self.tile, cw // self.tile
        sup = [(w, h) for w in range(1, self.max_tiles + 1) for h in range(1, self.max_tiles + 1)
               if w * h <= self.max_tiles]
        return {"resized": [cw, ch], "tiles": nh * nw, "aspect_ratio": [nh, nw],
                "aspect_ratio_id": sup.index((nh, nw)) + 1, "pixel_tiles": self.max_tiles,
                "patches": self.max_tiles * self.ppt8, "cross_kv_tokens": self.max_tiles * self.ppt,
                "tokens": 1, "markup": 0}

    def image_token_id(self):
        return self.cfg.image_token_index

    def image_ids(self, lay):
        return [self.cfg.image_token_index]

    def pixel_spec(self, batch, lays):
        return {"pixel_values": ("randn", (batch, len(lays), self.max_tiles, 3, self.tile, self.tile),
                                 torch.float32)}

    def extra_inputs(self, batch, lays, ids):
        n = len(lays)
        ar_ids = torch.tensor([[l["aspect_ratio_id"] for l in lays]] * batch, dtype=torch.long)
        ar_mask = torch.zeros(batch, n, self.max_tiles, dtype=torch.long)
        for j, l in enumerate(lays):
            ar_mask[:, j, :l["tiles"]] = 1
        # processing_mllama: each image attends from its <|image|> token to the next one (or to the end);
        # consecutive image tokens all attend to the end of the sequence
        S = ids.shape[1]
        cam = torch.zeros(batch, S, n, self.max_tiles, dtype=torch.long)
        for b in range(batch):
            locs = [i for i, t in enumerate(ids[b].tolist()) if t == self.cfg.image_token_index]
            masks = [[a, c] for a, c in zip(locs[:-1], locs[1:])] + [[locs[-1], S]]
            last_end = masks[-1][1]
            for m in masks[::-1]:
                if m[0] == m[1] - 1:
                    m[1] = last_end
                last_end = m[1]
            for j, ((st, en), l) in enumerate(zip(masks, lays)):
                cam[b, st:en, j, :l["tiles"]] = 1
        return {"aspect_ratio_ids": ar_ids, "aspect_ratio_mask": ar_mask, "cross_attention_mask": cam}

    def tower(self, model):
        return [model.model.vision_model]

    def projector(self, model):
        return [model.model.multi_modal_projector]


FAMILIES = {
    "qwen2_5_vl": QwenVL, "qwen3_vl": QwenVL, "gemma3": Gemma3,
    "smolvlm": Idefics3Like, "idefics3": Idefics3Like, "llava_next": LlavaNext, "mllama": Mllama,
}


def family_of(cfg, pre):
    mt = cfg.model_type
    if mt not in FAMILIES:
        raise SystemExit(f"vlm.py: model_type {mt!r} is not one of {sorted(FAMILIES)}")
    f = FAMILIES[mt](cfg, pre)
    f.name = mt
    return f


# ----------------------------------------------------------------------------------------------
# The step
# ----------------------------------------------------------------------------------------------
def set_trainable(fam, model, vision, projector):
    model.requires_grad_(True)
    for m in fam.tower(model):
        m.requires_grad_(vision == "trained")
    for m in fam.projector(model):
        m.requires_grad_(projector == "trained")  # a module or a bare parameter (image_newline)


def build_inputs(fam, batch, images, image_size, text_tokens):
    W, H = image_size
    lays = [dict(fam.layout(W, H), orig=[W, H]) for _ in range(images)]
    row = fam.sample_ids(lays, text_tokens)
    ids = torch.tensor([row] * batch, dtype=torch.long)
    labels = ids.masked_fill(ids == fam.image_token_id(), -100)
    if lays:
        extra = fam.extra_inputs(batch, lays, ids)
        pix = fam.pixel_spec(batch, lays)
    else:
        # a text-only batch (--images 0): the processor returns no pixel values, and the
        # model runs neither the tower nor the projector
        extra = fam.text_only_inputs(batch, ids)
        pix = {}
    return lays, ids, labels, extra, pix


def make_step(fam, model, batch, images, image_size, text_tokens, optimizer, amp, gc, vision,
              projector, lora_r=0):
    with _disable_current_modes():  # real index tensors, made fake constants below
        lays, ids, labels, extra, pix = build_inputs(fam, batch, images, image_size, text_tokens)
        ones = {k: torch.ones(shape, dtype=dt) for k, (how, shape, dt) in pix.items() if how == "ones"}
    if gc:
        model.gradient_checkpointing_enable()
    model.train(optimizer != "none")
    fam.patch(model)
    base = model
    if lora_r:
        model, _, _ = apply_lora(model, lora_r, 2 * lora_r)
        base.requires_grad_(False)
        for n, p_ in model.named_parameters():
            if "lora_" in n:
                p_.requires_grad_(True)
        for m in fam.tower(base):
            m.requires_grad_(vision == "trained")
        for m in fam.projector(base):
            m.requires_grad_(projector == "trained")
    else:
        set_trainable(fam, model, vision, projector)
    inputs = {"input_ids": const(ids), "labels": const(labels)}
    for k, v in extra.items():
        inputs[k] = const(v)
    for k, (how, shape, dt) in pix.items():
        if how == "randn":
            inputs[k] = torch.randn(shape, dtype=dt)
        else:
            inputs[k] = const(ones[k])
    params = [p for p in model.parameters() if p.requires_grad]
    opt = H.make_optimizer(optimizer, params) if optimizer != "none" else None

    def fwd():
        ctx = torch.autocast("cpu", dtype=torch.bfloat16) if amp else H.nullctx()
        with ctx:
            if optimizer != "none":
                return model(**inputs)
            kw = {k: v for k, v in inputs.items() if k != "labels"}
            return model(**kw)
    return lays, ids, inputs, opt, fwd, model, base


_HERE = os.path.dirname(os.path.abspath(__file__))


def _import_peft():
    """The peft library, not validation/peft.py (this directory is on sys.path)."""
    mod = sys.modules.get("peft")
    if mod is not None and os.path.dirname(os.path.abspath(getattr(mod, "__file__", "") or "")) != _HERE:
        return mod
    sys.modules.pop("peft", None)
    saved = list(sys.path)
    sys.path[:] = [q for q in sys.path if os.path.abspath(q or ".") != _HERE]
    try:
        import peft
    finally:
        sys.path[:] = saved
    return peft


def lm_module(model):
    inner = model.model
    for name in ("language_model", "text_model"):
        if hasattr(inner, name):
            return getattr(inner, name)
    raise SystemExit("no language model module found")


def apply_lora(model, r, alpha):
    """peft's real get_peft_model with LoRA on every nn.Linear of the language model's decoder
    layers (q/k/v/o, MLP; Mllama's cross-attention too), not on the tower, the projector or the
    LM head. Adapters fp32 (autocast_adapter_dtype=True, peft's default). FakeTensor parameters
    refuse torch.utils.swap_tensors (used by Module._apply when peft casts the adapters), so
    `param.data = new` is used (the harness's swap_via_set_data)."""
    peft = _import_peft()
    lm = lm_module(model)
    prefix = {id(m): n for n, m in model.named_modules()}[id(lm)]
    targets = [f"{prefix}.{n}" for n, m in lm.named_modules()
               if isinstance(m, torch.nn.Linear) and ".layers." in f".{n}"]
    with H.swap_via_set_data():
        lc = peft.LoraConfig(r=r, lora_alpha=alpha, lora_dropout=0.0, target_modules=targets, bias="none")
        pm = peft.get_peft_model(model, lc, autocast_adapter_dtype=True)
    return pm, len(targets), peft.__version__


def build_vlm(cfg, arch, attn, dtype):
    """The model class from the config, random weights. torch's trunc_normal_ (SigLIP's lecun_normal_
    init) loops on `mask.any()`, a data-dependent value under FakeTensorMode: it is replaced by an
    in-place normal_ for the construction (no allocation either way)."""
    import transformers
    import transformers.initialization as TI
    cls = getattr(transformers, arch)
    orig = TI.TORCH_INIT_FUNCTIONS["trunc_normal_"]
    TI.TORCH_INIT_FUNCTIONS["trunc_normal_"] = (
        lambda tensor, mean=0.0, std=1.0, a=-2.0, b=2.0, generator=None: tensor.normal_(mean, std))
    try:
        return cls._from_config(cfg, attn_implementation=attn, dtype=dtype)
    finally:
        TI.TORCH_INIT_FUNCTIONS["trunc_normal_"] = orig


@contextlib.contextmanager
def vlm_model(config_path, precision, attn):
    """The model of `config_path` built under a fresh FakeTensorMode, entered for the with-block
    (the one `const` makes constants in): yields (family, model)."""
    install()
    torch.manual_seed(0)
    cfg, arch, pre = load_vlm_config(config_path, attn)
    fam = family_of(cfg, pre)
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    _FAKE["mode"] = fake
    with fake:
        yield fam, build_vlm(cfg, arch, attn, torch.bfloat16 if precision == "bf16" else torch.float32)


def measure_vlm(config_path, model_name, batch, images, image_size, text_tokens, precision,
                optimizer, attn="sdpa", gc=False, vision="frozen", projector="trained", lora_r=0):
    t0 = time.time()
    amp = precision == "amp_bf16"
    train = optimizer != "none"
    with vlm_model(config_path, precision, attn) as (fam, model):
        lays, ids, inputs, opt, fwd, model, base = make_step(fam, model, batch, images, image_size,
                                                             text_tokens, optimizer, amp, gc, vision,
                                                             projector, lora_r)
        H.warm_up(fwd, opt, train)
        H.SDPA_LOG.clear()
        meter = H.PhaseTracker(H.param_storages(model))
        meter.track_external(model, *inputs.values())
        if opt is not None:
            meter.track_external(opt)
        with meter:
            step = H.measured_step(meter, fwd, opt, train, amp)

    def count(ms):
        return sum(m.numel() if isinstance(m, torch.nn.Parameter) else sum(p.numel() for p in m.parameters())
                   for m in ms)
    config = H.base_config(
        model_name, batch, int(ids.shape[1]), precision, optimizer, attn, gc,
        images=images, image_size=[int(image_size[0]), int(image_size[1])], vision=vision,
        projector=projector, lm="lora" if lora_r else "full", text_tokens=text_tokens,
        **({"method": "lora", "lora_r": lora_r, "lora_alpha": 2 * lora_r, "lora_dropout": 0.0,
            "lora_targets": "lm-all-linear", "lora_dtype": "fp32"} if lora_r else {}))
    config["image"] = int(image_size[0])  # the image's width (224 in the text rows)
    versions = H.versions()
    if lora_r:
        versions["peft"] = _import_peft().__version__
    row = H.step_row(
        config, versions, sum(p.numel() for p in model.parameters()), step, t0,
        after={"versions": {"family": fam.name, "image_tokens": sum(l["tokens"] for l in lays),
                            "vision_patches": sum(l["patches"] for l in lays),
                            "image_markup_tokens": sum(l["markup"] for l in lays),
                            "image_layout": lays[0] if lays else None}},
        after_params={"trainable_params": sum(p.numel() for p in model.parameters() if p.requires_grad),
                      "vision_params": count(fam.tower(base)), "projector_params": count(fam.projector(base))})
    row["sdpa_kernels"] = dict(H.SDPA_LOG)
    H.SDPA_LOG.clear()
    return row


CHECK_SIZES = [(224, 224), (336, 336), (448, 448), (672, 448), (1000, 600), (1024, 768), (336, 1008),
               (1344, 896), (1344, 1344), (2000, 300)]


def check_processors(config_dir, out=None):
    """Run the real transformers image processors (PIL backends, constructed directly with the
    published preprocessor_config values, no download) on blank images of each size and compare
    the tiles / patches / pixel shapes and the processors' own token counts with `layout()`."""
    import types
    import numpy as np
    import PIL.Image
    import transformers as T
    lines = [f"# processor check, transformers {T.__version__}, PIL {PIL.__version__}"]
    bad = 0

    def img(W, H):
        return PIL.Image.fromarray(np.full((H, W, 3), 128, dtype=np.uint8))

    def report(name, W, H, mine, theirs):
        nonlocal bad
        ok = all(mine.get(k) == v for k, v in theirs.items())
        bad += 0 if ok else 1
        lines.append(f"  {name:<26} {W:>4}x{H:<4} {'OK ' if ok else 'BAD'} processor {theirs} | vlm.py "
                     f"{ {k: mine.get(k) for k in theirs} }")

    def fam_for(fname):
        cfg, arch, pre = load_vlm_config(os.path.join(config_dir, fname), "sdpa")
        return family_of(cfg, pre), cfg, pre

    # Qwen2.5-VL (Qwen2VLImageProcessor, patch 14, merge 2, temporal 2)
    for fname, label in (("qwen2.5-vl-7b-4l.json", "qwen2.5-vl"), ("qwen3-vl-4b-4l.json", "qwen3-vl")):
        if not os.path.exists(os.path.join(config_dir, fname)):
            continue
        fam, cfg, pre = fam_for(fname)
        ip = T.Qwen2VLImageProcessorPil(patch_size=fam.p, merge_size=fam.m, temporal_patch_size=fam.tp,
                                        size={"shortest_edge": fam.min_pixels, "longest_edge": fam.max_pixels})
        lines.append(f"## {label}: Qwen2VLImageProcessorPil(patch_size={fam.p}, merge_size={fam.m}, "
                     f"size={{shortest_edge: {fam.min_pixels}, longest_edge: {fam.max_pixels}}})")
        for W, H in CHECK_SIZES:
            o = ip(images=[img(W, H)], return_tensors="pt")
            g = o["image_grid_thw"][0].tolist()
            mine = fam.layout(W, H)
            theirs = {"grid_thw": g, "patches": int(o["pixel_values"].shape[0]),
                      # Qwen2_5_VLProcessor.replace_image_token: grid.prod() // merge_size**2
                      "tokens": int(o["image_grid_thw"][0].prod()) // ip.merge_size ** 2}
            report(label, W, H, mine, theirs)
        ipd = T.Qwen2VLImageProcessorPil(patch_size=fam.p)
        o = ipd(images=[img(1344, 1344)], return_tensors="pt")
        lines.append(f"  (class default size {ipd.size}: 1344x1344 -> grid {o['image_grid_thw'][0].tolist()}, "
                     f"i.e. max_pixels matters: pass the checkpoint's preprocessor_config)")
    # Gemma 3
    fam, cfg, pre = fam_for("gemma3-4b-vl-6l.json")
    ip = T.Gemma3ImageProcessorPil(size={"height": 896, "width": 896})
    lines.append("## gemma3: Gemma3ImageProcessorPil(size={height: 896, width: 896}), pan-and-scan off; "
                 "Gemma3Processor full_image_sequence")
    gp = types.SimpleNamespace()
    seq = "\n\n<boi>" + "<img>" * cfg.mm_tokens_per_image + "<eoi>\n\n"
    for W, H in CHECK_SIZES:
        o = ip(images=[img(W, H)], return_tensors="pt")
        mine = fam.layout(W, H)
        theirs = {"resized": list(o["pixel_values"].shape[-1:-3:-1]),
                  "patches": (o["pixel_values"].shape[-1] // cfg.vision_config.patch_size) ** 2,
                  "tokens": seq.count("<img>"), "markup": 4}
        report("gemma3", W, H, mine, theirs)
    del gp
    # SmolVLM
    import transformers.models.smolvlm.processing_smolvlm as SP
    fam, cfg, pre = fam_for("smolvlm2-500m.json")
    ip = T.SmolVLMImageProcessorPil(size={"longest_edge": fam.L}, max_image_size={"longest_edge": fam.Mx},
                                    do_image_splitting=True)
    lines.append(f"## smolvlm: SmolVLMImageProcessorPil(size={{longest_edge: {fam.L}}}, max_image_size="
                 f"{{longest_edge: {fam.Mx}}}), processing_smolvlm.get_image_prompt_string(image_seq_len={fam.tpt})")
    for W, H in CHECK_SIZES:
        o = ip(images=[[img(W, H)]], return_tensors="pt", return_row_col_info=True)
        rows, cols = o["rows"][0][0], o["cols"][0][0]
        s = SP.get_image_prompt_string(rows, cols, fam.tpt, "<F>", "<I>", "<G>")
        ntok = s.count("<I>")
        markup = s.count("<F>") + s.count("<G>") + s.count("<row_") + s.count("\n")
        mine = fam.layout(W, H)
        theirs = {"rows": rows, "cols": cols, "tiles": int(o["pixel_values"].shape[1]),
                  "tokens": ntok, "markup": markup,
                  "patches": int(o["pixel_values"].shape[1]) * (fam.Mx // cfg.vision_config.patch_size) ** 2}
        report("smolvlm", W, H, mine, theirs)
    lines.append(f"  pixel_attention_mask dtype {o['pixel_attention_mask'].dtype}, pixel_values {o['pixel_values'].dtype}")
    # LLaVA-NeXT
    import transformers.models.llava_next.processing_llava_next as LP
    fam, cfg, pre = fam_for("llava-v1.6-mistral-7b-4l.json")
    ip = T.LlavaNextImageProcessorPil(size={"shortest_edge": 336}, crop_size={"height": 336, "width": 336},
                                      image_grid_pinpoints=fam.pinpoints, do_pad=True)
    stub = types.SimpleNamespace(image_processor=ip, patch_size=fam.ps,
                                 num_additional_image_tokens=fam.extra_tok)
    stub._get_unpadded_features = types.MethodType(LP.LlavaNextProcessor._get_unpadded_features, stub)
    lines.append("## llava-next: LlavaNextImageProcessorPil(size 336, crop 336, pinpoints of the config), "
                 "LlavaNextProcessor._get_number_of_features (- 1 for strategy 'default')")
    for W, H in CHECK_SIZES:
        o = ip(images=[img(W, H)], return_tensors="pt")
        hh, ww = o["pixel_values"].shape[-2:]
        n = LP.LlavaNextProcessor._get_number_of_features(stub, H, W, hh, ww) - 1
        mine = fam.layout(W, H)
        theirs = {"tiles": int(o["pixel_values"].shape[1]), "tokens": n,
                  "patches": int(o["pixel_values"].shape[1]) * ((336 // fam.ps) ** 2 + 1)}
        report("llava-next", W, H, mine, theirs)
    if os.path.exists(os.path.join(config_dir, "llama3.2-11b-vision-5l.json")):
        fam, cfg, pre = fam_for("llama3.2-11b-vision-5l.json")
        ip = T.MllamaImageProcessorPil(size={"height": fam.tile, "width": fam.tile}, max_image_tiles=fam.max_tiles)
        lines.append(f"## mllama: MllamaImageProcessorPil(size {fam.tile}, max_image_tiles {fam.max_tiles})")
        for W, H in CHECK_SIZES:
            o = ip(images=[[img(W, H)]], return_tensors="pt")
            mine = fam.layout(W, H)
            theirs = {"tiles": int(o["num_tiles"][0][0]), "aspect_ratio_id": int(o["aspect_ratio_ids"][0][0]),
                      "pixel_tiles": int(o["pixel_values"].shape[2])}
            report("mllama", W, H, mine, theirs)
        # cross_attention_mask: processing_mllama's own functions on the same token ids
        import transformers.models.mllama.processing_mllama as MP
        for nimg, (W, H) in ((1, (672, 448)), (2, (1000, 600)), (3, (224, 224))):
            lays = [dict(fam.layout(W, H), orig=[W, H]) for _ in range(nimg)]
            ids = torch.tensor([fam.sample_ids(lays, 40)] * 2)
            mine = fam.extra_inputs(2, lays, ids)["cross_attention_mask"]
            sparse = [MP.get_cross_attention_token_mask(r, cfg.image_token_index) for r in ids.tolist()]
            dense = MP.convert_sparse_cross_attention_mask_to_dense(
                sparse, [[l["tiles"] for l in lays]] * 2, fam.max_tiles, ids.shape[1])
            ok = bool((torch.from_numpy(dense) == mine).all())
            bad += 0 if ok else 1
            lines.append(f"  mllama cross_attention_mask {nimg} image(s) {W}x{H}: {'OK' if ok else 'BAD'} "
                         f"(shape {tuple(mine.shape)}, {int(mine.sum())} ones)")
    lines.append(f"{'all agree' if not bad else str(bad) + ' disagreements'}")
    text = "\n".join(lines) + "\n"
    if out:
        with open(out, "w") as f:
            f.write(text)
    sys.stdout.write(text)
    return 1 if bad else 0


def _group(path):
    """Module path -> component: 'visual.blocks.3', 'language_model.layers.0', 'vision_model.global_transformer.layers.1',
    'multi_modal_projector', ..."""
    import re
    p = path or "(model)"
    for pre in ("base_model.model.", "model.", "module."):
        if p.startswith(pre):
            p = p[len(pre):]
    if p.startswith("model."):
        p = p[len("model."):]
    m = re.search(r"^(.*?(?:blocks|layers|layer)\.\d+)(?:\.|$)", p)
    if m:
        return m.group(1)
    first = p.split(".")[0]
    return ".".join(p.split(".")[:2]) if first in ("visual", "vision_tower", "vision_model") else first


def dump_saved(config_path, batch, images, image_size, text_tokens, precision, attn="sdpa", gc=False,
               vision="frozen", projector="trained", out=None, lora_r=0):
    """Every tensor autograd saves for backward in one forward (+ loss), deduplicated by storage,
    with the module that created it (dump_saved.py's machinery), grouped per vision block / LM
    layer / projector; plus what is alive at the end of the forward without being saved."""
    import dump_saved as DS
    from torch.utils.weak import WeakIdKeyDictionary
    amp = precision == "amp_bf16"
    packed = []
    lines = []
    with vlm_model(config_path, precision, attn) as (fam, model):
        lays, ids, inputs, opt, fwd, model, base = make_step(fam, model, batch, images, image_size,
                                                             text_tokens, "adamw", amp, gc, vision,
                                                             projector, lora_r)
        stack = DS.module_stack(model)
        param_st = DS.storage_names(model, buffers=False)
        rec = DS.Recorder(stack)
        for k, v in inputs.items():
            rec.created[v.untyped_storage()] = (f"(input {k})", "")
        mt = H.PhaseTracker(H.param_storages(model))
        mt.track_external(model, *inputs.values())

        import weakref

        def pack(t):
            # autograd keeps the tensor; only a weak reference here, so that what the graph frees
            # at the end of the forward (e.g. an unused last vision layer) is not kept alive
            packed.append((weakref.ref(t), stack[-1] if stack else ""))
            return t

        def unpack(t):
            return t
        H.SDPA_LOG.clear()
        with mt:
            start = mt.snap()
            mt.record_copies = amp
            with rec, torch.autograd.graph.saved_tensors_hooks(pack, unpack):
                o = fwd()
                loss = o.loss
                del o
            mt.record_copies = False
            end = mt.snap()
            copies = [r() for r in mt.copy_refs]
            seen = WeakIdKeyDictionary()
            per = collections.OrderedDict()
            rows = []
            for tref, ppath in packed:
                t = tref()
                if t is None:
                    continue
                st = t.untyped_storage()
                if st in seen:
                    continue
                seen[st] = True
                if st in param_st:
                    continue
                op, cpath = rec.created.get(st, ("(before forward)", ""))
                if op.startswith("(input") or op == "(before forward)":
                    kind = "input"
                else:
                    kind = "act"
                w = mt._WINFO.get(st, (None, None))[0]
                b = w.mem_consumed if w is not None else H.rnd(st.nbytes())
                g = _group(cpath)
                amp_copy = any(st is c for c in copies if c is not None)
                if kind == "act":
                    per.setdefault(g, [0, 0])
                    per[g][0] += b
                    per[g][1] += 1
                rows.append((g, cpath, op, _group(ppath), list(t.shape), str(t.dtype).replace("torch.", ""),
                             b, kind + (" ampcopy" if amp_copy else "")))
            alive = []
            for st, (w, _) in list(mt._WINFO.items()):
                if st in seen or st in param_st or st not in rec.created:
                    continue
                op, cpath = rec.created[st]
                if op.startswith("(input"):
                    continue
                alive.append((_group(cpath), cpath, op, w.mem_consumed))
    tot = sum(v[0] for v in per.values())
    al = sum(a[3] for a in alive)
    lines.append(f"# {os.path.basename(config_path)} b{batch} {images}x{image_size} text {text_tokens} "
                 f"{precision} vision={vision} projector={projector} gc={gc}: seq {ids.shape[1]}, "
                 f"layout {lays[0]}, kernels {dict(H.SDPA_LOG)}")
    lines.append(f"saved activations {tot} + alive-not-saved {al} = {tot + al}; MemTracker saved_act_bytes "
                 f"{end['total'] - start['total']}")
    lines.append("## saved bytes per component (created in)")
    for g, (b, n) in per.items():
        lines.append(f"  {g:<40} {b:>14} in {n} tensors")
    lines.append("## saved tensors: component | created in :: op | packed in | shape dtype | bytes | kind")
    for g, cpath, op, pg, shape, dt, b, kind in rows:
        lines.append(f"  {g:<28} {cpath} :: {op} | {pg} | {shape} {dt} | {b} | {kind}")
    lines.append("## alive at end of forward, not saved")
    for g, cpath, op, b in alive:
        lines.append(f"  {g:<28} {cpath} :: {op} | {b}")
    text = "\n".join(lines) + "\n"
    H.SDPA_LOG.clear()
    if out:
        with open(out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)


# ----------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------
def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    H.add_model_args(ap, seq=None, precision="bf16")  # the sequence: text tokens + the images' tokens
    ap.add_argument("--images", type=int, default=1,
                    help="images per sample (0: a text-only batch, the tower and projector idle on the GPU)")
    ap.add_argument("--image-size", type=int, nargs=2, default=[448, 448], metavar=("W", "H"))
    ap.add_argument("--text-tokens", type=int, default=256, help="text tokens per sample")
    ap.add_argument("--optimizer", choices=["adamw", "sgd", "none"], default="adamw")
    ap.add_argument("--gc", action="store_true", help="gradient checkpointing (vision blocks and LM layers)")
    ap.add_argument("--vision", choices=["frozen", "trained"], default="frozen")
    ap.add_argument("--projector", choices=["frozen", "trained"], default="trained")
    ap.add_argument("--lora-r", type=int, default=0,
                    help="LoRA (peft) of rank R, alpha 2R, on every Linear of the language model's layers; "
                    "the LM base weights, embeddings and head frozen (default 0: full LM fine-tuning)")
    H.add_run_args(ap)
    ap.add_argument("--keep-kernel-log", action="store_true")
    ap.add_argument("--dump", metavar="FILE", help="list the saved-for-backward tensors of the forward "
                    "(by vision block / LM layer / projector) to FILE ('-' = stdout) instead of measuring")
    ap.add_argument("--check-processors", nargs="?", const="-", metavar="FILE",
                    help="compare the token arithmetic with the real image processors (report to FILE)")
    a = ap.parse_args(argv)
    if a.check_processors:
        return check_processors(os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs"),
                                None if a.check_processors == "-" else a.check_processors)
    if a.dump:
        dump_saved(a.config, a.batch, a.images, a.image_size, a.text_tokens, a.precision, a.attn, a.gc,
                   a.vision, a.projector, None if a.dump == "-" else a.dump, a.lora_r)
        return 0
    done = H.dispatch(a, __file__, argv_of, main, ["--keep-kernel-log"] if a.keep_kernel_log else [])
    if done is not None:
        return done
    if not a.config:
        ap.error("--config, --grid or --from-row is required")
    name = a.model_name or os.path.splitext(os.path.basename(a.config))[0]
    row = measure_vlm(a.config, name, a.batch, a.images, a.image_size, a.text_tokens, a.precision,
                      a.optimizer, a.attn, a.gc, a.vision, a.projector, a.lora_r)
    kernels = row.pop("sdpa_kernels")
    if a.keep_kernel_log:
        row["sdpa_kernels"] = kernels
    return H.emit(row, a.out, f"[vlm] {name} b{a.batch} {a.images}x{a.image_size[0]}x{a.image_size[1]} "
                  f"text {a.text_tokens} seq {row['config']['seq']} {a.precision} vision={a.vision} "
                  f"projector={a.projector} gc={a.gc}{' lora r' + str(a.lora_r) if a.lora_r else ''}: "
                  f"peak {H.gib(row['peak_bytes'])} in {row['peak_phase']}, saved "
                  f"{H.gib(row['saved_act_bytes'])}, kernels {kernels}, {row['time_s']} s")


GRID_FLAGS = {"model": "--model-name", "batch": "--batch", "images": "--images", "text_tokens": "--text-tokens",
              "precision": "--precision", "optimizer": "--optimizer", "attn": "--attn", "vision": "--vision",
              "projector": "--projector", "gc": "--gc", "lora_r": "--lora-r"}


def argv_of(entry):
    """The command line (without --config) of a grid entry or a row's config (its `seq` follows
    from the images and the text tokens)."""
    return H.flags(entry, GRID_FLAGS) + ["--image-size", *map(str, entry["image_size"])]


if __name__ == "__main__":
    sys.exit(main())
