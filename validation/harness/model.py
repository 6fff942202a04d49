"""Building what is measured: a model from a Hugging Face config (random weights, nothing
downloaded; transformers' class, or the plain-PyTorch one of validation/gpu/ where transformers is
missing), its optimizer, and activation checkpointing as transformers and torchtitan apply it."""
from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile

import torch


@contextlib.contextmanager
def config_file(d):
    """A config dict (a scaled-down copy, say) as a temporary config.json: yields its path, for
    `load_config` or a recipe that takes a path; removed on exit."""
    fd, path = tempfile.mkstemp(suffix=".json", prefix="harness_cfg_")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(d, f)
        yield path
    finally:
        os.unlink(path)


def load_config(path, attn, overrides=None):
    """A transformers config from a config.json (`overrides`: keys of the JSON replaced first, a
    shrunk model) and its architecture."""
    import transformers
    with open(path) as f:
        d = json.load(f)
    d = dict(d)
    d.update(overrides or {})
    if d.get("model_type") == "gemma3" and isinstance(d.get("text_config"), dict):
        # multimodal Gemma 3 (4b/12b/27b): train the language model, Gemma3ForCausalLM on text_config
        td = dict(d["text_config"])
        td.setdefault("model_type", "gemma3_text")
        td["architectures"] = ["Gemma3ForCausalLM"]
        if "vocab_size" not in td and "vocab_size" in d:
            td["vocab_size"] = d["vocab_size"]
        d = td
    mt = d.pop("model_type")
    for k in ("transformers_version", "_name_or_path", "torch_dtype", "dtype"):
        d.pop(k, None)
    cfg = transformers.AutoConfig.for_model(mt, **d)
    cfg.use_cache = False
    arch = (d.get("architectures") or [None])[0]
    return cfg, arch


def text_vocab(cfg):
    v = getattr(cfg, "vocab_size", None)
    if v is None:
        v = cfg.get_text_config().vocab_size
    return v


def mlm_or_clm_labels(cfg, arch, ids):
    """Labels = input ids: the causal-LM loss of decoders, and for masked LMs (BERT, RoBERTa,
    XLM-R) a masked-LM loss with every token labelled."""
    return ids



def build_model(cfg, arch, attn, dtype):
    import transformers
    if attn == "sdpa" and cfg.model_type == "gemma2":
        raise SystemExit("Gemma 2 cannot run with attn=sdpa in transformers 5.24 (Gemma2ForCausalLM refuses "
                         "SDPA: attention logit soft-capping); measure it with --attn eager")
    if arch and hasattr(transformers, arch):
        cls = getattr(transformers, arch)
    elif cfg.model_type == "bert":
        cls = transformers.BertForMaskedLM
    else:
        cls = transformers.AutoModelForCausalLM
    if cls is transformers.AutoModelForCausalLM:
        model = cls.from_config(cfg, attn_implementation=attn, dtype=dtype)
    else:
        model = cls._from_config(cfg, attn_implementation=attn, dtype=dtype)
    return model


GPU_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gpu")


def build_plain_model(cfg, dtype, device=None):
    """validation/gpu/plain_llama.py's CausalLM from a config.json's dict: transformers' Llama /
    Qwen3 op for op in plain PyTorch, for a machine without transformers (no transformers here)."""
    if GPU_DIR not in sys.path:
        sys.path.insert(0, GPU_DIR)
    import plain_llama
    return plain_llama.CausalLM(cfg, dtype=dtype, device=device)


OPT_IMPLS = ("fused", "foreach", "forloop")


def make_optimizer(optimizer, params, opt_impl="foreach", weight_decay=None):
    """torch.optim AdamW / Adam / SGD (momentum 0.9) with the chosen implementation:
    fused -> fused=True (torch._fused_adamw_ / _fused_adam_ / _fused_sgd_), foreach -> foreach=True
    (the harness's default), forloop -> foreach=False, fused=False (the single-tensor path).
    weight_decay None keeps torch's default (AdamW 1e-2, Adam 0, SGD 0)."""
    if opt_impl not in OPT_IMPLS:
        raise ValueError(f"opt_impl must be one of {OPT_IMPLS}, not {opt_impl!r}")
    kw = {"fused": True} if opt_impl == "fused" else {"foreach": opt_impl == "foreach"}
    if weight_decay is not None:
        kw["weight_decay"] = weight_decay
    if optimizer == "adamw":
        return torch.optim.AdamW(params, lr=1e-4, **kw)
    if optimizer == "adam":
        return torch.optim.Adam(params, lr=1e-4, **kw)
    if optimizer == "sgd":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9, **kw)
    raise ValueError(f"unknown optimizer {optimizer!r}")


# torchtitan v0.2.2 (tag, commit 73a0e6979dd10b6b1904098eb3c8f62c18ab87ce),
# torchtitan/models/llama3/infra/parallelize.py lines 36-51, `_op_sac_save_list`, verbatim; the two
# entries that exist only once a module is imported / a backend is present are resolved by name
# (torch.ops.torch_attn._varlen_attn is registered by torch.nn.attention.varlen).
def _titan_op_sac_save_list():
    import torch.nn.attention.varlen  # noqa: F401  registers torch_attn::_varlen_attn
    ops = {
        torch.ops.aten.mm.default,
        torch.ops.aten._scaled_dot_product_efficient_attention.default,
        torch.ops.aten._scaled_dot_product_flash_attention.default,
        torch.ops.aten._scaled_dot_product_cudnn_attention.default,
        torch.ops.aten._scaled_dot_product_attention_math.default,
        torch.ops.aten._scaled_dot_product_fused_attention_overrideable.default,
        torch.ops._c10d_functional.reduce_scatter_tensor.default,
        # for low precision training, it's useful to always save
        # the result of max, since the absolute maximum is
        # used to compute the scaling factor for quantization.
        torch.ops.aten.max.default,
        torch._higher_order_ops.flex_attention,
    }
    for get in (lambda: torch.ops.torch_attn._varlen_attn.default,
                lambda: torch._higher_order_ops.inductor_compiled_code):
        try:
            ops.add(get())
        except (AttributeError, RuntimeError):
            pass
    return ops


def _titan_op_sac_context_fn(mm_recompute_shapes=frozenset()):
    """torchtitan v0.2.2 torchtitan/distributed/activation_checkpoint.py `_apply_op_sac` (lines
    98-128): a fresh policy (and mm counters) per checkpointed call; every compute op of the save
    list is saved (MUST_SAVE) except every second aten.mm (counted separately in the forward and
    in the recompute), the rest is recomputed. `mm_recompute_shapes` comes from
    per_op_sac_force_recompute_mm_shapes_by_fqns (default ["moe.router.gate"]: no such module in
    a dense Hugging Face model, so empty)."""
    from collections import defaultdict
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
    op_sac_save_list = _titan_op_sac_save_list()

    def _get_custom_policy(meta):
        def _custom_policy(ctx, func, *args, **kwargs):
            if (
                func == torch.ops.aten._to_copy.default
                and "cuda" in str(args[0].device)
                and "device" in kwargs
                and str(kwargs["device"]) == "cpu"
            ):
                return CheckpointPolicy.MUST_SAVE

            mode = "recompute" if ctx.is_recompute else "forward"
            mm_count_key = f"{mode}_mm_count"
            if func == torch.ops.aten.mm.default:
                if args[1].shape in mm_recompute_shapes:
                    return CheckpointPolicy.PREFER_RECOMPUTE
                meta[mm_count_key] += 1
            # Saves output of all compute ops, except every second mm
            to_save = func in op_sac_save_list and not (
                func == torch.ops.aten.mm.default and meta[mm_count_key] % 2 == 0
            )
            return (
                CheckpointPolicy.MUST_SAVE
                if to_save
                else CheckpointPolicy.PREFER_RECOMPUTE
            )

        return _custom_policy

    def selective_checkpointing_context_fn():
        meta = defaultdict(int)
        return create_selective_checkpoint_contexts(_get_custom_policy(meta))

    return selective_checkpointing_context_fn


GC_LAYERS: dict = {}


def apply_gc_policy(model, policy):
    """Selective activation checkpointing as torchtitan v0.2.2 applies it (ptd checkpoint_wrapper:
    torch.utils.checkpoint.checkpoint with use_reentrant=False, preserve_rng_state=True,
    determinism_check="default", early_stop=False, debug=False), through transformers' own
    per-layer checkpointing (GradientCheckpointingLayer checkpoints `forward`, hooks stay outside):
      every:N - layer-level SAC (`_apply_layer_sac`): a counter over the transformer blocks starting
                at 1; block k (1-based) is checkpointed iff k % N == 0, i.e. 0-based layers N-1,
                2N-1, ...; the others keep all their activations;
      ops     - per-op SAC (`_apply_op_sac`) on every block: _titan_op_sac_context_fn.
    And transformers' own layer selection, for comparison:
      hf-every:N - `activation_checkpointing_enable(every_n_layers=N)` (Trainer:
                gradient_checkpointing_kwargs={"every_n_layers": N}) with its default
                {"use_reentrant": False} (early_stop=True): 0-based layers i with i % N == 0."""
    from transformers.modeling_layers import GradientCheckpointingLayer
    if policy.startswith("hf-every:"):
        n = int(policy.split(":", 1)[1])
        if n < 1:
            raise ValueError("hf-every:N needs N >= 1")
        model.activation_checkpointing_enable(every_n_layers=n)
        layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
        GC_LAYERS["checkpointed"] = [i for i, m in enumerate(layers) if m.gradient_checkpointing]
        GC_LAYERS["n_layers"] = len(layers)
        GC_LAYERS["early_stop"] = True
        return
    kw = {"use_reentrant": False, "preserve_rng_state": True, "early_stop": False}
    if policy == "ops":
        kw["context_fn"] = _titan_op_sac_context_fn()
        freq = 1
    elif policy.startswith("every:"):
        freq = int(policy.split(":", 1)[1])
        if freq < 1:
            raise ValueError("every:N needs N >= 1")
    else:
        raise ValueError(f"unknown gc policy {policy!r} (full, every:N, ops)")
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kw)
    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    chosen = []
    for i, layer in enumerate(layers):
        on = (i + 1) % freq == 0
        layer.gradient_checkpointing = on
        if on:
            chosen.append(i)
    GC_LAYERS["checkpointed"] = chosen
    GC_LAYERS["n_layers"] = len(layers)

