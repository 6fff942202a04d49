#!/usr/bin/env python3
"""Measure one step of TRL 1.16.0's DPOTrainer and GRPOTrainer: per phase (generation, scoring, training)
peak memory, with TRL's own loss / log-prob / generation code running under FakeTensorMode.

A recipe of the harness (validation/harness/: FakeTensorMode, MemTracker, the CUDA emulation: 512-byte
rounding, CUDA SDPA kernel choice, CUDA autocast lists, native_dropout; the training step with its gradient
accumulation, the row and its writer) and of trainers.py (accelerate's bf16 wrapper of model.forward, the
all-ones attention-mask skip); what it varies is the RL objective, its phases and TRL's code in them.
TRL 1.16.0 is not the venv's trl (1.13.0, used by trainers.py): it is installed on its own with
`pip install --no-deps --target validation/.venv/trl-1.16.0-rl trl==1.16.0` and put first on sys.path
by this script only (RL_TRL_DIR overrides the folder). See validation/RL.md.

What runs for real (TRL 1.16.0 / transformers 5.24 / peft 0.21.2 code):
  * DPO: DPOTrainer.compute_loss -> _compute_loss on a stub trainer (DPOTrainer.__new__ + the attributes
    it reads): one forward of the 2B concatenated [chosen; rejected] rows through trl's add_fused_lm_head
    (ChunkedLogProbFunction), the reference forward (separate frozen-by-no_grad copy, or the same PEFT
    model inside trl's use_adapter(model, None), or precomputed log-probs from the batch), the sigmoid
    loss and the metrics; then backward and the optimizer step. --reference precomputed also measures
    DPOTrainer.compute_ref_log_probs (the precompute pass, before training: no optimizer state yet).
  * GRPO: generation = transformers' model.generate with the GenerationConfig GRPOTrainer.__init__ builds,
    inside trl's unwrap_model_for_generation + torch.no_grad(); scoring = GRPOTrainer.
    _get_per_token_logps_and_entropies for the old-policy (when TRL computes them) and reference (beta>0)
    log-probs under no_grad + disable_gradient_checkpointing, exactly as _generate_and_score_completions
    calls them; training = GRPOTrainer.compute_loss (-> _compute_loss, loss_type from GRPOConfig) on each
    micro-batch, backward, optimizer step.
Shimmed (see RL.md): Triton (trl's fused-head fold kernels allocate nothing on a GPU: replaced by no-op
launches, `_use_triton` answers True so the CUDA code path - compact valid rows, in-place tiles - runs);
`_addmm_fp32` (CUDA: addmm(out_dtype=fp32, out=acc), no allocation); boolean indexing / nonzero (their
count is read from a real CPU "shadow" of the small integer tensors, see ValueShadow); .item()/bool() of
integer tensors answered from those shadows; sampled tokens are never EOS (every completion runs to
max_completion_length); long generations are fast-forwarded (a DynamicCache pre-grown to P+C-k tokens,
then the real generate for the last k tokens), vLLM is not run (its reservation is a formula, RL.md).

Example:
  python validation/rl.py --objective dpo --config validation/configs/qwen3-0.6b.json --model-name qwen3-0.6b \
      --batch 2 --max-prompt 512 --max-completion 512 --reference separate --out rows.jsonl
  python validation/rl.py --objective grpo --config validation/configs/qwen3-0.6b.json --model-name qwen3-0.6b \
      --prompts 1 --generations 8 --max-prompt 256 --max-completion 1024 --beta 0.0
  python validation/rl.py --grid validation/grid-rl.json --out core/tests/fixtures/rl-measured.jsonl
  python validation/rl.py --from-row '<a row of core/tests/fixtures/rl-measured.jsonl>'
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import importlib.util
import json
import math
import os
import sys
import time
import types

_HERE = os.path.dirname(os.path.abspath(__file__))
TRL_VERSION = "1.16.0"
TRL_DIR = os.environ.get("RL_TRL_DIR", os.path.join(_HERE, ".venv", "trl-1.16.0-rl"))
VLLM_VERSION = "0.31.0"  # newest vLLM that TRL 1.16.0 accepts (trl/import_utils.py: 0.22.0 <= v <= 0.31.0)
# validation/peft.py would shadow the peft library: drop this folder from the front of sys.path
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
if os.path.isdir(TRL_DIR):
    sys.path.insert(0, TRL_DIR)
sys.path.append(_HERE)
import trainers as T  # noqa: E402  (must come before harness.install_cuda_emulation(): it reads transformers' originals)
import harness as H  # noqa: E402

import torch  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode  # noqa: E402
from torch.distributed._tools import mem_tracker as _mt  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes  # noqa: E402
from torch.utils._pytree import tree_flatten, tree_map  # noqa: E402
from torch.utils.weak import WeakIdKeyDictionary  # noqa: E402

aten = torch.ops.aten
GRID = os.path.join(_HERE, "grid-rl.json")  # names the config.json of rows named otherwise (llama-3.2-1b)
H.quiet()


def _load_validation_peft():
    """validation/peft.py (for its public resolve_targets), loaded under another name."""
    spec = importlib.util.spec_from_file_location("validation_peft", os.path.join(_HERE, "peft.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ----------------------------------------------------------------------------------------------
# Values of the small integer tensors: a real CPU "shadow" next to each fake tensor
# ----------------------------------------------------------------------------------------------
SHADOW_MAX_NUMEL = 1 << 24
FALLBACKS = collections.Counter()


def _is_intlike(t):
    return isinstance(t, torch.Tensor) and not t.is_floating_point() and not t.is_complex()


_TRACE_SHAPE = [int(x) for x in os.environ["RL_TRACE_SHAPE"].split(",")] if os.environ.get("RL_TRACE_SHAPE") else None


class ValueShadow(TorchDispatchMode):
    """FakeTensors carry no values, but TRL's and transformers' control flow reads a few: boolean-mask indexing
    (`hidden_states[labels != -100]` in trl's fused head: its row count), `.item()` / `bool()` of token counts,
    the stopping test of model.generate (`unfinished_sequences.max() == 0`). Every op whose inputs are all
    integer/bool tensors with a known value (inputs made from real tensors, factories, ...) and whose outputs are
    integer/bool is replayed on the real CPU shadows (outside every mode), so the value is known. The op itself runs
    on the fake tensors below this mode (MemTracker sees it). Floating-point tensors have no shadow.

    Boolean indexing is emulated as CUDA runs it (ATen expandTensors): `nonzero(mask)` -> an (N, mask.dim()) int64
    tensor, then `index` with its columns; N from the shadow. `masked_scatter` allocates CUDA's int64 prefix-sum
    of the mask (masked_scatter_cuda). `multinomial` (sampling) gets the shadow token 0 (never an EOS of the
    models measured): every completion runs to max_new_tokens."""

    def __init__(self):
        super().__init__()
        self.sh = WeakIdKeyDictionary()

    def get(self, t):
        if not isinstance(t, torch.Tensor):
            return None
        if not isinstance(t, FakeTensor):
            return t  # a real tensor is its own value
        return self.sh.get(t)

    def put(self, fake_t, real_t):
        if isinstance(fake_t, FakeTensor) and real_t is not None and not isinstance(real_t, FakeTensor):
            self.sh[fake_t] = real_t

    def _nonzero(self, mask):
        s = self.get(mask)
        with _disable_current_modes():
            if s is None:
                # a mask computed from floating-point values (metrics: tensor[~isnan(tensor)]): all True, the
                # largest selection (and the real one for NaN tests)
                FALLBACKS["mask_all_true"] += 1
                real = torch.ones(mask.shape, dtype=torch.bool).nonzero()
            else:
                real = s.nonzero()
        nz = torch.empty((real.shape[0], mask.dim()), dtype=torch.long, device=mask.device)
        self.put(nz, real)
        return nz

    def _expand_bool(self, indices):
        new, nzs = [], []
        for idx in indices:
            if isinstance(idx, torch.Tensor) and idx.dtype in (torch.bool, torch.uint8):
                nz = self._nonzero(idx)
                nzs.append(nz)
                for j in range(idx.dim()):
                    col = nz.select(1, j)
                    with _disable_current_modes():
                        rc = self.get(nz).select(1, j)
                    self.put(col, rc)
                    new.append(col)
            else:
                new.append(idx)
        return new, nzs

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (aten.index.Tensor, aten.index_put.default, aten.index_put_.default,
                    aten._unsafe_index_put.default) and any(
                isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in (args[1] or [])):
            new, nzs = self._expand_bool(args[1])
            args = (args[0], new) + tuple(args[2:])
            out = func(*args, **kwargs)
            self._shadow(func, args, kwargs, out)
            del nzs
            return out
        if func is aten.nonzero.default:
            return self._nonzero(args[0])
        if func in (aten.masked_scatter.default, aten.masked_scatter_.default):
            # masked_scatter_cuda: maskPrefixSum = at::empty(mask.sizes(), kLong) + an exclusive scan
            prefix = torch.empty(args[1].shape, dtype=torch.long, device=args[1].device)
            out = func(*args, **kwargs)
            del prefix
            return out
        out = func(*args, **kwargs)
        if _TRACE_SHAPE and isinstance(out, torch.Tensor) and list(out.shape) == _TRACE_SHAPE:
            import traceback
            print("[trace]", func, out.dtype, file=sys.stderr)
            traceback.print_stack(limit=8, file=sys.stderr)
        if func is aten.multinomial.default:
            with _disable_current_modes():
                self.put(out, torch.zeros(out.shape, dtype=out.dtype))
            return out
        self._shadow(func, args, kwargs, out)
        return out

    def _shadow(self, func, args, kwargs, out):
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        if not outs or not all(_is_intlike(t) and t.numel() <= SHADOW_MAX_NUMEL for t in outs):
            # a mutated integer tensor with a float-derived new value: its shadow is stale
            if func._schema.is_mutable:
                for t in outs:
                    if isinstance(t, FakeTensor):
                        self.sh.pop(t, None)
            return
        flat = tree_flatten((args, kwargs))[0]
        tensors = [t for t in flat if isinstance(t, torch.Tensor)]
        if any(t.is_floating_point() and isinstance(t, FakeTensor) for t in tensors) or \
                any(self.get(t) is None for t in tensors):
            if os.environ.get("RL_SHADOW_DEBUG"):
                print("[shadow] skip", func, [(str(t.dtype), self.get(t) is None) for t in tensors], file=sys.stderr)
            if func._schema.is_mutable:
                for t in outs:
                    if isinstance(t, FakeTensor):
                        self.sh.pop(t, None)
            return

        def to_real(x):
            if isinstance(x, torch.Tensor):
                return self.get(x)
            if isinstance(x, torch.device):
                return torch.device("cpu")
            return x
        r_args, r_kwargs = tree_map(to_real, (args, kwargs))
        if "device" in r_kwargs:
            r_kwargs["device"] = torch.device("cpu")
        try:
            with _disable_current_modes():
                real = func(*r_args, **r_kwargs)
        except Exception as e:
            if os.environ.get("RL_SHADOW_DEBUG"):
                print("[shadow] fail", func, e, file=sys.stderr)
            return
        r_outs = [t for t in tree_flatten(real)[0] if isinstance(t, torch.Tensor)]
        if len(r_outs) == len(outs):
            for f, r in zip(outs, r_outs):
                self.put(f, r)


class ShadowScalars:
    """.item() / bool() / tolist() of a fake tensor: its shadow's value when it has one; otherwise 0 /
    False (a metric of floating-point values: on a GPU these calls only synchronise, they allocate nothing).
    The fallbacks are counted in FALLBACKS."""

    def __init__(self, shadow):
        self.shadow = shadow

    def __enter__(self):
        C = torch.Tensor
        self.saved = {n: getattr(C, n) for n in ("item", "__bool__", "tolist")}
        sh, saved = self.shadow, self.saved

        def make(name, fallback):
            orig = saved[name]

            def f(t, *a):
                if isinstance(t, FakeTensor):
                    s = sh.get(t)
                    if s is not None:
                        with _disable_current_modes():
                            return orig(s, *a)
                    FALLBACKS[name] += 1
                    if name == "tolist":
                        with _disable_current_modes():
                            return torch.zeros(t.shape).tolist()
                    return fallback
                return orig(t, *a)
            return f
        C.item = make("item", 0.0)
        C.__bool__ = make("__bool__", False)
        C.tolist = make("tolist", None)
        return self

    def __exit__(self, *a):
        for n, f in self.saved.items():
            setattr(torch.Tensor, n, f)
        return False


# ----------------------------------------------------------------------------------------------
# TRL's fused LM head on the emulated CUDA device
# ----------------------------------------------------------------------------------------------
class _NoopLaunch:
    """A Triton kernel launch `kernel[grid](...)`: trl's _forward_kernel / _backward_kernel update the running
    statistics / the tile in place and allocate nothing."""

    def __getitem__(self, grid):
        return lambda *a, **k: None


_TRL_SHIMMED = False


def install_trl_cuda_shims():
    """trl.kernels.chunked_logprob on CUDA: `_use_triton(device)` is True (compact valid rows: hidden[mask]; the
    Triton fold kernels, which allocate nothing); `_addmm_fp32(acc, a, b)` is torch.addmm(acc, a, b,
    out_dtype=float32, out=acc) (torch >= 2.8 on CUDA: in place, no fp32 copies of a / b)."""
    global _TRL_SHIMMED
    if _TRL_SHIMMED:
        return
    import trl.kernels.chunked_logprob as cl
    import trl.trainer.utils as tu
    cl._use_triton = lambda device: True
    tu._use_triton = lambda device: True
    cl._forward_kernel = _NoopLaunch()
    cl._backward_kernel = _NoopLaunch()

    def _addmm_fp32(acc, a, b):
        return None  # addmm(out=acc): in place, allocates nothing
    cl._addmm_fp32 = _addmm_fp32
    _TRL_SHIMMED = True


# ----------------------------------------------------------------------------------------------
# Tracker: windows (sub-phase peaks), repeated calls of the root module (generate, adapters-off reference)
# ----------------------------------------------------------------------------------------------
def _grad_aware_mod_tracker():
    """torch's ModTracker registers a multi-grad hook on every module input / output that requires grad, also under
    no_grad. transformers' enable_input_require_grads (installed by gradient checkpointing) makes the embedding
    output require grad in the no_grad forwards too (generate, reference / old-policy scoring); the hook then keeps
    that tensor alive from C++ (a cycle Python's gc cannot see), which a GPU run without the tracker does not. Under
    no_grad there is no backward to track: skip the hooks there."""
    from torch.distributed._tools.mod_tracker import ModTracker

    class GradAwareModTracker(ModTracker):
        def _fw_pre_hook(self, mod, input):
            if torch.is_grad_enabled():
                return super()._fw_pre_hook(mod, input)
            name = self._get_mod_name(mod)
            w_mod = __import__("weakref").ref(mod)
            self._get_append_fn(w_mod, name, False)()
            if self._user_pre_fw_hook is not None:
                self._user_pre_fw_hook(mod, input)

        def _fw_post_hook(self, mod, input, output):
            if torch.is_grad_enabled():
                return super()._fw_post_hook(mod, input, output)
            name = self._get_mod_name(mod)
            w_mod = __import__("weakref").ref(mod)
            if self._user_post_fw_hook is not None:
                self._user_post_fw_hook(mod, input, output)
            self._get_pop_fn(w_mod, name, False)()
    return GradAwareModTracker()


class RLTracker(T.TrainerTracker):
    def __init__(self, param_storages, dump=False):
        super().__init__(param_storages, dump=dump)
        self._mod_tracker = _grad_aware_mod_tracker()
        self.lists = {}  # --dump: what is alive (storages >= 1 MiB) at each phase's peak
        self.windows = {}  # name -> {"peak": total, "snap": categories, "start": total}
        self.open = set()

    def keep(self, name):
        if self.dump:
            self.lists[name] = self.peak_list

    def _pre_fw_hook(self, module, inputs):
        # MemTracker refuses a root module called again in forward ("multiple iterative calls"): generate calls the
        # model once per token, DPO with a PEFT policy calls it again for the reference. Drop the per-module
        # statistics (unused here) at each new root call.
        if module in self.memory_tracking and not self._mod_tracker.is_bw:
            name = self._mod_tracker.get_known_fqn(module)
            if set(self._mod_tracker.parents) - {name} == {"Global"}:
                self.memory_tracking.clear()
        return super()._pre_fw_hook(module, inputs)

    def _pre_bw_hook(self, module, args):
        # per-module backward snapshots only (unused here); a module whose statistics were dropped above would
        # raise a KeyError
        return None

    def _post_bw_hook(self, module, args):
        return None

    def _update_peak_stats(self, peak_state):
        super()._update_peak_stats(peak_state)
        if self.open:
            tot = sum(v[_mt._TOTAL_KEY] for v in self._curr_mem_snap.values())
            for name in self.open:
                w = self.windows[name]
                if tot > w["peak"]:
                    w["peak"] = tot
                    w["snap"] = H.flat(self.get_tracker_snapshot("current"))
                    if self.dump:
                        self.lists["window:" + name] = self.alive()

    @contextlib.contextmanager
    def window(self, name):
        cur = self.snap()
        self.windows[name] = {"peak": cur["total"], "snap": cur, "start": cur["total"]}
        self.open.add(name)
        try:
            yield
        finally:
            self.open.discard(name)
            self.windows[name]["end"] = self.snap()["total"]


# ----------------------------------------------------------------------------------------------
# Trainer stubs
# ----------------------------------------------------------------------------------------------
class RLAccelerator(T.StubAccelerator):
    """What DPOTrainer / GRPOTrainer read from accelerate's Accelerator on one process. autocast() is accelerate's
    native AMP context (bf16=True, the TRL configs' default), i.e. the emulated CUDA autocast."""
    device = torch.device("cpu")
    process_index = 0
    local_process_index = 0
    is_main_process = True
    sync_gradients = True
    state = types.SimpleNamespace(deepspeed_plugin=None, fsdp_plugin=None, distributed_type="NO")
    distributed_type = "NO"
    deepspeed_plugin = None

    def __init__(self, amp=True):
        self.amp = amp

    def autocast(self):
        return torch.autocast("cpu", dtype=torch.bfloat16) if self.amp else contextlib.nullcontext()

    @staticmethod
    def gather(x):
        return x

    @staticmethod
    def reduce(x, reduction="sum"):
        return x

    @staticmethod
    def pad_across_processes(x, dim=0, pad_index=0):
        return x


def _args(**kw):
    base = dict(report_to=[], gradient_checkpointing_kwargs=None, n_gpu=1, prediction_loss_only=False,
                average_tokens_across_devices=True, use_liger_kernel=False, bf16=True, fp16=False)
    base.update(kw)
    return types.SimpleNamespace(**base)


def dpo_stub(model, ref_model, o):
    from trl.trainer.dpo_trainer import DPOTrainer
    stub = DPOTrainer.__new__(DPOTrainer)
    stub.__dict__.update(
        model=model, ref_model=ref_model, accelerator=RLAccelerator(),
        args=_args(gradient_checkpointing=o.gc, discopop_tau=0.05, precompute_ref_log_probs=o.reference == "precomputed"),
        precompute_ref_logps=o.reference == "precomputed", aux_loss_enabled=False, router_aux_loss_coef=0.0,
        ld_alpha=None, f_divergence_type="reverse_kl", f_alpha_divergence_coef=0.5, loss_types=["sigmoid"],
        loss_weights=[1.0], beta=0.1, use_weighting=False, label_smoothing=0.0,
        _metrics={"train": collections.defaultdict(list), "eval": collections.defaultdict(list)},
        _total_train_tokens=0, _tp_size=1, state=types.SimpleNamespace(global_step=0),
    )
    return stub


def grpo_stub(model, ref_model, o):
    from trl.trainer.grpo_trainer import GRPOTrainer
    stub = GRPOTrainer.__new__(GRPOTrainer)
    stub.__dict__.update(
        model=model, ref_model=ref_model, accelerator=RLAccelerator(),
        args=_args(gradient_checkpointing=o.gc, steps_per_generation=o.steps_per_generation, delta=None,
                   use_bias_correction_kl=True, per_device_train_batch_size=o.batch,
                   gradient_accumulation_steps=o.steps_per_generation, entropy_target=0.2),
        beta=o.beta, loss_type=o.loss_type, epsilon_low=0.2, epsilon_high=0.2, importance_sampling_level="token",
        top_entropy_quantile=1.0, off_policy_mask_threshold=None, use_vllm=o.generator != "model",
        vllm_importance_sampling_correction=True, vllm_importance_sampling_mode="sequence_mask",
        _entropy_bonus_enabled=False, use_adaptive_entropy=False, entropy_coef=0.0, aux_loss_enabled=False,
        router_aux_loss_coef=0.0, current_gradient_accumulation_steps=o.steps_per_generation,
        max_completion_length=o.max_completion, temperature=1.0, num_iterations=o.num_iterations,
        _metrics={"train": collections.defaultdict(list), "eval": collections.defaultdict(list)},
        state=types.SimpleNamespace(global_step=0), _step=0,
    )
    return stub


# ----------------------------------------------------------------------------------------------
# Models
# ----------------------------------------------------------------------------------------------
def model_dtype(o):
    return torch.bfloat16 if o.precision == "bf16" else torch.float32


def build_policy(cfg, arch, o):
    """The policy as DPOTrainer / GRPOTrainer hold it before training: the model in the loading dtype
    (model_init_kwargs dtype: bf16, or TRL's default float32 for --precision amp_bf16), with --lora peft's
    get_peft_model(model, LoraConfig) (TRL's ModelConfig defaults: r=16, alpha=32, dropout 0.05, peft's default
    targets q_proj/v_proj unless --lora-targets), trl's disable_dropout_in_model (DPO default), Trainer's
    gradient checkpointing (+ enable_input_require_grads for PEFT, as DPOTrainer.__init__ does)."""
    from trl.trainer.utils import disable_dropout_in_model
    model = H.build_model(cfg, arch, o.attn, model_dtype(o))
    if o.lora:
        from peft import LoraConfig, get_peft_model
        H.install_frozen_param_hook_guard()  # the frozen base weights
        targets = None if o.lora_targets in (None, "default") else \
            _load_validation_peft().resolve_targets(cfg, o.lora_targets)
        lc = LoraConfig(r=o.lora_r, lora_alpha=2 * o.lora_r, lora_dropout=0.05, target_modules=targets,
                        bias="none", task_type="CAUSAL_LM")
        with H.swap_via_set_data():
            model = get_peft_model(model, lc)  # autocast_adapter_dtype=True: fp32 adapters
    if o.objective == "dpo" or o.disable_dropout:
        disable_dropout_in_model(model)
    if o.gc:
        T.enable_checkpointing(model, None)
        if o.lora:
            model.enable_input_require_grads()
    model.train(True)
    model.config.use_cache = False
    # from_pretrained's generation_config: use_cache=True (GenerationConfig.from_model_config of the published
    # config.json; harness.load_config sets config.use_cache=False before the model is built, which would make
    # generate() re-run the whole sequence at every token)
    base_of(model).generation_config.use_cache = True
    return model


def build_ref(cfg, arch, o):
    """create_model_from_path(model id, dtype=policy dtype, attn_implementation=policy's): a second full model,
    parameters left requiring grad (TRL does not freeze them; every reference forward runs under no_grad),
    from_pretrained's eval mode."""
    from trl.trainer.utils import disable_dropout_in_model
    ref = H.build_model(cfg, arch, o.attn, model_dtype(o))
    ref.eval()
    if o.objective == "dpo" or o.disable_dropout:
        disable_dropout_in_model(ref)
    return ref


def base_of(model):
    return model.get_base_model() if hasattr(model, "get_base_model") else model


# ----------------------------------------------------------------------------------------------
# Inputs
# ----------------------------------------------------------------------------------------------
def _ids(vocab, shape, avoid, g):
    t = torch.randint(0, vocab, shape, dtype=torch.long, generator=g)
    for a in avoid:
        t[t == a] = (a + 1) % vocab
    return t


def eos_ids(cfg):
    e = getattr(cfg, "eos_token_id", None)
    if e is None:
        return []
    return list(e) if isinstance(e, (list, tuple)) else [int(e)]


def fake_inputs(fake, shadow, real):
    out = {}
    for k, v in real.items():
        if isinstance(v, torch.Tensor):
            f = fake.from_tensor(v)
            shadow.put(f, v)
            out[k] = f
        else:
            out[k] = v
    return out


# ----------------------------------------------------------------------------------------------
# Measurement helpers
# ----------------------------------------------------------------------------------------------
def _phase_record(mt, peak, start, end):
    return {"peak_bytes": peak["total"], "at_peak": peak, "start_bytes": start["total"], "end_bytes": end["total"]}


def kv_bytes(cache):
    tot, dts = 0, set()
    for layer in getattr(cache, "layers", []):
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if isinstance(t, torch.Tensor) and t.numel():
                tot += H.rnd(t.untyped_storage().nbytes())
                dts.add(str(t.dtype).replace("torch.", ""))
    kd = vd = None
    if getattr(cache, "layers", None):
        l0 = cache.layers[0]
        kd = str(l0.keys.dtype).replace("torch.", "") if isinstance(getattr(l0, "keys", None), torch.Tensor) else None
        vd = str(l0.values.dtype).replace("torch.", "") if isinstance(getattr(l0, "values", None), torch.Tensor) else None
    return tot, kd, vd


def training_step(mt, loss_of, opt, amp, micro_batches=1):
    """Trainer.training_step on the harness's step: compute_loss (`loss_of(i)`: the loss of micro-batch i) and
    backward per micro-batch, then optimizer.step() + zero_grad(set_to_none=True) (Trainer's defaults). The
    step's `extra` holds the first micro-batch's saved-activation and autocast-copy bytes (the row's)."""
    i = [0]

    def fwd():
        return H.LossOnly(loss_of(i[0]))

    def on_phase(name, meter, step):
        if name == "fwd" and i[0] == 0:
            step.extra.update(saved=step.saved_act_bytes, copies=step.amp_copy)
        meter.keep("opt" if name == "opt" else f"{name}[{i[0]}]")
        if name == "bwd":
            i[0] += 1
        meter.phase = "bwd" if name == "fwd" else "fwd" if i[0] < micro_batches else "opt"
    mt.phase = "fwd"
    return H.measured_step(mt, fwd, opt, True, amp, micro_batches=micro_batches, on_phase=on_phase)


def reference_bytes(row, ref):
    """The row's reference_param_bytes (the separate reference model's parameters and buffers) and
    policy_param_bytes (the tracked parameters less the reference's)."""
    ref_params = H.storage_bytes(ref.parameters()) if ref is not None else 0
    row["reference_param_bytes"] = ref_params + (H.storage_bytes(ref.buffers()) if ref is not None else 0)
    row["policy_param_bytes"] = row["param_bytes"] - ref_params


# ----------------------------------------------------------------------------------------------
# DPO
# ----------------------------------------------------------------------------------------------
def measure_dpo(o):
    from trl.trainer import dpo_trainer as dt
    from trl.trainer.dpo_trainer import DPOTrainer
    from trl.trainer.utils import add_fused_lm_head
    t0 = time.time()
    torch.manual_seed(0)
    cfg, arch = H.load_config(o.config, o.attn)
    amp = o.precision == "amp_bf16"
    B, P, C = o.batch, o.max_prompt, o.max_completion
    S = P + C
    vocab = H.text_vocab(cfg)
    g = torch.Generator().manual_seed(0)
    ids = _ids(vocab, (2 * B, S), eos_ids(cfg), g)  # [chosen (B rows); rejected (B rows)], no padding
    completion_mask = torch.zeros(2 * B, S, dtype=torch.long)
    completion_mask[:, P:] = 1
    real = {"input_ids": ids, "attention_mask": torch.ones(2 * B, S, dtype=torch.long),
            "completion_mask": completion_mask}
    if o.reference == "precomputed":
        real["ref_chosen_logps"] = torch.zeros(B)
        real["ref_rejected_logps"] = torch.zeros(B)
    T.FACTS.all_ones_mask = True
    n_scored = int((completion_mask[:, 1:] != 0).sum())

    fake = FakeTensorMode(allow_non_fake_inputs=True)
    shadow = ValueShadow()
    ref_window = {}
    with fake:
        policy = build_policy(cfg, arch, o)
        ref = build_ref(cfg, arch, o) if o.reference == "separate" else None
        # DPOTrainer.__init__: fused head on the (base) policy with the metrics' outputs, and on the reference
        outputs = ("log_probs", "entropy", "mean_logits", "is_top1")
        add_fused_lm_head(base_of(policy), outputs=outputs)
        if ref is not None:
            add_fused_lm_head(ref)
        # accelerate.prepare_model with bf16 mixed precision: autocast + convert_outputs_to_fp32 (both models)
        T.wrap_accelerate_amp(policy)
        if ref is not None:
            T.wrap_accelerate_amp(ref)
        inputs = fake_inputs(fake, shadow, real)
        stub = dpo_stub(policy, ref, o)
        params = [p for p in policy.parameters() if p.requires_grad]
        opt = H.make_optimizer("adamw", params, o.opt_impl)

        orig_dgc = dt.disable_gradient_checkpointing
        holder = {}

        @contextlib.contextmanager
        def dgc_window(model, kwargs=None):
            # _compute_loss wraps (only) the reference forward in disable_gradient_checkpointing: its peak window
            mt_ = holder.get("mt")
            with orig_dgc(model, kwargs):
                if mt_ is not None:
                    with mt_.window("reference"):
                        yield
                else:
                    yield
        dt.disable_gradient_checkpointing = dgc_window

        def fwd(i=0):
            batch = dict(inputs)
            loss = DPOTrainer.compute_loss(stub, policy, batch)
            del batch
            return loss

        scoring = None
        if o.reference == "precomputed":
            # DPOTrainer.__init__ -> _precompute_ref_logps -> compute_ref_log_probs(self.model, batch) per batch of
            # precompute_ref_batch_size (default per_device_train_batch_size), before training: weights only.
            pmt = RLTracker(H.param_storages(policy))
            pmt.track_external(policy, *[v for v in inputs.values() if isinstance(v, torch.Tensor)])
            with pmt, shadow, ShadowScalars(shadow):
                s = pmt.snap()
                pmt.reset_peak()
                pre = {k: v for k, v in inputs.items() if k not in ("ref_chosen_logps", "ref_rejected_logps")}
                r = DPOTrainer.compute_ref_log_probs(stub, policy, pre)
                del r, pre
                scoring = _phase_record(pmt, pmt.peak(), s, pmt.snap())
                scoring["what"] = "precompute_ref_log_probs pass (before training: weights only, no optimizer state)"
        with shadow, ShadowScalars(shadow):
            H.warm_up(lambda: H.LossOnly(fwd()), opt, True)  # untracked: optimizer state, autocast caches

        mt = RLTracker(H.param_storages(policy, ref), dump=bool(o.dump))
        mt.track_external(policy, *[v for v in inputs.values() if isinstance(v, torch.Tensor)])
        mt.track_external(ref, opt)  # (None is skipped)
        holder["mt"] = mt
        with mt, shadow, ShadowScalars(shadow):
            step = training_step(mt, lambda i: fwd(), opt, amp)
        holder.pop("mt")
        dt.disable_gradient_checkpointing = orig_dgc
        ref_window = mt.windows.get("reference")

    extra_cfg = {"objective": "dpo", "reference": o.reference, "generations": None, "max_prompt": P,
                 "max_completion": C, "generator": None, "sequences_per_forward": 2 * B,
                 "loss_type": "sigmoid", "beta": 0.1, "n_scored_tokens": n_scored}
    phases = {"generation": None, "scoring": scoring["peak_bytes"] if scoring else None,
              "training": max(v["total"] for v in step.phase_peaks.values())}
    details = {"scoring": scoring, "reference_forward": None}
    if ref_window:
        details["reference_forward"] = {
            "peak_bytes": ref_window["peak"], "at_peak": ref_window["snap"], "start_bytes": ref_window["start"],
            "end_bytes": ref_window.get("end"),
            "what": "inside fwd: the reference forward under no_grad (policy activations of this step alive)"}
    row = assemble_row(o, policy, step, phases, extra_cfg, details, t0)
    reference_bytes(row, ref)
    return row, mt


# ----------------------------------------------------------------------------------------------
# GRPO
# ----------------------------------------------------------------------------------------------
def _prebuilt_cache(model, cfg, n_seq, length, dtypes):
    """A DynamicCache holding `length` tokens per layer, as the real generation leaves it after P+C-k-1 tokens:
    per layer keys / values of shape (n_seq, kv_heads, length, head_dim) in the dtypes the real run produced
    (torch.cat in DynamicLayer.update gives a fresh contiguous tensor per step, so this is the same storage)."""
    import transformers
    cache = transformers.DynamicCache(config=model.config)
    tc = cfg.get_text_config()
    kvh = getattr(tc, "num_key_value_heads", None) or tc.num_attention_heads
    hd = getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads
    kd, vd = dtypes
    for layer in cache.layers:
        layer.keys = torch.empty((n_seq, kvh, length, hd), dtype=kd)
        layer.values = torch.empty((n_seq, kvh, length, hd), dtype=vd)
        layer.device = layer.keys.device
        layer.dtype = kd
        layer.is_initialized = True
    return cache


def generation_config(cfg, o):
    """GRPOTrainer.__init__ (use_vllm=False): GenerationConfig(max_new_tokens=max_completion_length, do_sample=True,
    pad/bos/eos from the tokenizer, temperature=1.0, top_p=1.0, top_k=0, min_p=None, repetition_penalty=1.0,
    cache_implementation=None, disable_compile=True). The tokenizer's ids are those of config.json."""
    from transformers import GenerationConfig
    eos = eos_ids(cfg)
    pad = getattr(cfg, "pad_token_id", None)
    if pad is None:
        pad = eos[0] if eos else 0
    return GenerationConfig(max_new_tokens=o.max_completion, do_sample=True, pad_token_id=pad,
                            bos_token_id=getattr(cfg, "bos_token_id", None), eos_token_id=eos or None,
                            temperature=1.0, top_p=1.0, top_k=0, min_p=None, repetition_penalty=1.0,
                            cache_implementation=None, disable_compile=True)


def measure_grpo(o):
    import copy as _copy
    from trl.models.utils import disable_gradient_checkpointing, unwrap_model_for_generation
    from trl.trainer.grpo_trainer import GRPOTrainer
    from trl.trainer.utils import add_fused_lm_head, shuffle_sequence_dict, split_tensor_dict, use_adapter
    t0 = time.time()
    torch.manual_seed(0)
    cfg, arch = H.load_config(o.config, o.attn)
    amp = o.precision == "amp_bf16"
    Gt = o.prompts * o.generations  # generation batch (sequences): per_device_train_batch_size * steps_per_generation
    if Gt % o.steps_per_generation:
        raise SystemExit("prompts*generations must be divisible by --steps-per-generation")
    o.batch = Gt // o.steps_per_generation  # per_device_train_batch_size
    P, C = o.max_prompt, o.max_completion
    vocab = H.text_vocab(cfg)
    eos = eos_ids(cfg)
    g = torch.Generator().manual_seed(0)
    # the RepeatSampler repeats each prompt num_generations times: Gt prompt rows of P tokens (equal lengths: no
    # left padding)
    prompt = _ids(vocab, (o.prompts, P), eos, g).repeat_interleave(o.generations, dim=0)
    completion = _ids(vocab, (Gt, C), eos, g)
    T.FACTS.all_ones_mask = True
    generate_every = o.steps_per_generation * o.num_iterations
    old_logps = (o.steps_per_generation % generate_every != 0) or o.generator != "model"
    use_ref = o.beta != 0.0
    if use_ref and o.reference not in ("separate", "adapters-off"):
        raise SystemExit("beta > 0 needs --reference separate (or adapters-off with --lora)")
    if not use_ref:
        o.reference = "none"

    fake = FakeTensorMode(allow_non_fake_inputs=True)
    shadow = ValueShadow()
    gen = {}
    with fake:
        policy = build_policy(cfg, arch, o)
        ref = build_ref(cfg, arch, o) if (use_ref and o.reference == "separate") else None
        add_fused_lm_head(base_of(policy), temperature=1.0, cast_lm_head_to_fp32=False, outputs=("log_probs", "entropy"))
        if ref is not None:
            add_fused_lm_head(ref, temperature=1.0, cast_lm_head_to_fp32=False)
        T.wrap_accelerate_amp(policy)
        if ref is not None:
            T.wrap_accelerate_amp(ref)
        stub = grpo_stub(policy, ref, o)
        params = [p for p in policy.parameters() if p.requires_grad]
        opt = H.make_optimizer("adamw", params, o.opt_impl)
        gcfg = generation_config(cfg, o)
        gen_kwargs = gcfg.to_diff_dict()

        # the generation batch as _generate_and_score_completions leaves it (right-padded completions, no padding
        # here), split into steps_per_generation micro-batches
        with _disable_current_modes():  # real CPU tensors (their values become the shadows)
            real_batch = {
                "prompt_ids": prompt, "prompt_mask": torch.ones_like(prompt),
                "completion_ids": completion, "completion_mask": torch.ones_like(completion),
            }
            real_gen = {"input_ids": prompt, "attention_mask": torch.ones_like(prompt)}
            tail_n = min(o.tail_tokens, C)
            real_ff = {"input_ids": torch.cat([prompt, completion[:, :C - tail_n]], dim=1),
                       "attention_mask": torch.ones(Gt, P + C - tail_n, dtype=torch.long)}
        fb = fake_inputs(fake, shadow, real_batch)

        def micro_inputs(batch, old, refl, vllm_extra=None):
            d = dict(batch)
            if vllm_extra:
                d.update(vllm_extra)
            d["advantages"] = torch.zeros(Gt)
            d["num_items_in_batch"] = torch.full((), Gt * C, dtype=torch.long)
            if old is not None:
                d["old_per_token_logps"] = old
            if refl is not None:
                d["ref_per_token_logps"] = refl
            # _prepare_inputs: shuffle_sequence_dict (v[randperm] copies) then split_tensor_dict (views)
            return split_tensor_dict(shuffle_sequence_dict(d), o.steps_per_generation)

        def fwd_factory(parts):
            def fwd(i):
                return GRPOTrainer.compute_loss(stub, policy, parts[i])
            return fwd

        def warm_up_loss():
            parts = micro_inputs(fb, torch.zeros(Gt, C) if old_logps else None,
                                 torch.zeros(Gt, C) if use_ref else None,
                                 {"sampling_per_token_logps": torch.zeros(Gt, C),
                                  "importance_sampling_ratio": torch.ones(Gt, 1)} if o.generator != "model" else None)
            return H.LossOnly(fwd_factory(parts)(0))

        with shadow, ShadowScalars(shadow):
            H.warm_up(warm_up_loss, opt, True)  # untracked training step: optimizer state, autocast caches

        mt = RLTracker(H.param_storages(policy, ref), dump=bool(o.dump))
        mt.track_external(policy, *fb.values())
        mt.track_external(ref, opt)  # (None is skipped)
        with mt, shadow, ShadowScalars(shadow):
            start = mt.snap()
            # ---------------- generation
            gen_inputs = fake_inputs(fake, shadow, real_gen)
            mt.phase = "generation"
            g_start = mt.snap()
            mt.reset_peak()
            if o.generator == "model":
                head = C if (o.full_generation or C <= o.head_tokens + o.tail_tokens) else o.head_tokens
                cache = __import__("transformers").DynamicCache(config=policy.config)
                with unwrap_model_for_generation(policy, stub.accelerator, gather_deepspeed3_params=True,
                                                 generation_kwargs=gen_kwargs, gradient_checkpointing_kwargs=None) as um, \
                        torch.no_grad():
                    gc1 = _copy.deepcopy(gcfg)
                    gc1.max_new_tokens = head
                    out = um.generate(**gen_inputs, generation_config=gc1, past_key_values=cache)
                gen["head"] = {"new_tokens": head, "peak_bytes": mt.peak()["total"], "at_peak": mt.peak()}
                mt.keep("generation:head")
                gen["kv_bytes_head"], kd, vd = kv_bytes(cache)
                gen["kv_len_head"] = cache.get_seq_length()
                gen["kv_dtypes"] = {"keys": kd, "values": vd}
                peak_snap = mt.peak()
                del out, cache
                if head < C:
                    # fast-forward: the cache as it stands before the last `tail` tokens, then the real generate
                    tail = o.tail_tokens
                    L0 = P + C - tail
                    mt.reset_peak()
                    dtm = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
                    cache = _prebuilt_cache(policy, cfg, Gt, L0 - 1, (dtm[kd], dtm[vd]))
                    ids_ff = fake_inputs(fake, shadow, real_ff)
                    mt.reset_peak()
                    with unwrap_model_for_generation(policy, stub.accelerator, gather_deepspeed3_params=True,
                                                     generation_kwargs=gen_kwargs,
                                                     gradient_checkpointing_kwargs=None) as um, torch.no_grad():
                        gc2 = _copy.deepcopy(gcfg)
                        gc2.max_new_tokens = tail
                        out = um.generate(**ids_ff, generation_config=gc2, past_key_values=cache)
                    tp = mt.peak()
                    gen["tail"] = {"new_tokens": tail, "start_len": L0, "peak_bytes": tp["total"], "at_peak": tp}
                    mt.keep("generation:tail")
                    gen["kv_bytes_final"], _, _ = kv_bytes(cache)
                    gen["kv_len_final"] = cache.get_seq_length()
                    if tp["total"] > peak_snap["total"]:
                        peak_snap = tp
                    del out, cache, ids_ff
                else:
                    gen["kv_bytes_final"] = gen["kv_bytes_head"]
                    gen["kv_len_final"] = gen["kv_len_head"]
                gen["fast_forward"] = head < C
                gen["peak_bytes"] = peak_snap["total"]
                gen["at_peak"] = peak_snap
            else:
                # vLLM generates outside this process's PyTorch tensors (colocate: inside the reservation of RL.md;
                # server: on other GPUs); what the training process holds meanwhile is its state
                gen["peak_bytes"] = mt.snap()["total"]
                gen["at_peak"] = mt.snap()
                gen["what"] = f"{o.generator}: model state only; vLLM's own memory is not PyTorch's here (RL.md)"
            del gen_inputs
            g_end = mt.snap()
            gen["start_bytes"], gen["end_bytes"] = g_start["total"], g_end["total"]
            if o.dump:
                gen["alive_after"] = mt.alive()
            # ---------------- scoring (inside _generate_and_score_completions)
            mt.phase = "scoring"
            pc_ids = torch.cat([fb["prompt_ids"], fb["completion_ids"]], dim=1)
            attn = torch.cat([fb["prompt_mask"], fb["completion_mask"]], dim=1)
            s_start = mt.snap()
            mt.reset_peak()
            old = refl = None
            with torch.no_grad(), disable_gradient_checkpointing(policy, None):
                if old_logps:
                    old, _, _ = GRPOTrainer._get_per_token_logps_and_entropies(
                        stub, policy, pc_ids, attn, C, batch_size=o.batch)
                if use_ref:
                    if ref is not None:
                        refl, _, _ = GRPOTrainer._get_per_token_logps_and_entropies(
                            stub, ref, pc_ids, attn, C, batch_size=o.batch)
                    else:
                        with use_adapter(policy, adapter_name=None):
                            refl, _, _ = GRPOTrainer._get_per_token_logps_and_entropies(
                                stub, policy, pc_ids, attn, C, batch_size=o.batch)
                vllm_extra = None
                if o.generator != "model":
                    # vLLM's sampled-token logprobs (a padded (B, C) fp32 tensor) and the importance-sampling ratio,
                    # vllm_importance_sampling_mode="sequence_mask" (default): exp(sum((old - sampling) * mask)) per row
                    sampling = torch.zeros(Gt, C)
                    diff = torch.nan_to_num((old - sampling) * fb["completion_mask"], nan=0.0)
                    ratio = torch.exp(diff.sum(dim=-1, keepdim=True))
                    ratio = ratio.masked_fill((ratio < -math.inf) | (ratio > 3.0), value=0.0)
                    del diff
                    vllm_extra = {"sampling_per_token_logps": sampling, "importance_sampling_ratio": ratio}
            sp = mt.peak()
            mt.keep("scoring")
            scoring = {"peak_bytes": sp["total"], "at_peak": sp, "start_bytes": s_start["total"],
                       "end_bytes": mt.snap()["total"], "old_logps": bool(old_logps), "ref_logps": bool(use_ref)}
            del pc_ids, attn
            # ---------------- training
            parts = micro_inputs(fb, old, refl, vllm_extra)
            del old, refl, vllm_extra
            step = training_step(mt, fwd_factory(parts), opt, amp, micro_batches=o.steps_per_generation)
            del parts
            end = mt.snap()

    extra_cfg = {"objective": "grpo", "reference": o.reference, "generations": o.generations, "prompts": o.prompts,
                 "max_prompt": P, "max_completion": C, "generator": o.generator, "generation_batch": Gt,
                 "steps_per_generation": o.steps_per_generation, "num_iterations": o.num_iterations,
                 "loss_type": o.loss_type, "beta": o.beta, "sequences_per_forward": o.batch,
                 "n_scored_tokens": o.batch * C, "old_logps_computed": bool(old_logps),
                 "generation_fast_forward": gen.get("fast_forward")}
    if o.generator == "vllm-colocated":
        extra_cfg["vllm_gpu_memory_utilization"] = o.vllm_util
    phases = {"generation": gen["peak_bytes"], "scoring": scoring["peak_bytes"] if (old_logps or use_ref) else None,
              "training": max(v["total"] for v in step.phase_peaks.values())}
    details = {"generation": dict(gen), "scoring": scoring}
    # the row's start is before generation, its end after the training step's inputs are freed
    row = assemble_row(o, policy, dataclasses.replace(step, start=start, end=end), phases, extra_cfg, details, t0)
    reference_bytes(row, ref)
    if o.generator == "vllm-colocated":
        row["vllm"] = vllm_reservation(o.vllm_total_gib, o.vllm_util)
    return row, mt


def vllm_reservation(total_gib, util):
    """vLLM 0.31.0 v1 worker: requested_memory = ceil(total_memory * gpu_memory_utilization)
    (vllm/v1/worker/utils.py request_memory); see RL.md for what it contains."""
    total = int(total_gib * 2**30)
    return {"version": VLLM_VERSION, "total_memory_bytes": total, "gpu_memory_utilization": util,
            "requested_memory_bytes": int(math.ceil(total * util)),
            "note": "weights (bf16 copy) + KV cache + profiled activation/CUDA-graph/non-torch memory, all inside "
                    "requested_memory; held for the whole run unless vllm_enable_sleep_mode"}


# ----------------------------------------------------------------------------------------------
# Row
# ----------------------------------------------------------------------------------------------
def versions():
    v = T.versions()
    import trl
    v["trainer_versions"]["trl"] = trl.__version__
    try:
        from importlib.metadata import version
        v["trainer_versions"]["peft"] = version("peft")
    except Exception:
        pass
    v["trainer_versions"]["vllm_reservation_source"] = VLLM_VERSION
    return v


def assemble_row(o, policy, step, phases, extra_cfg, details, t0):
    """The harness's row of the training step (`step`; its start and end those of the whole RL step) with the
    RL step's phases: peak_bytes and at_peak are those of the highest phase (generation, scoring, training),
    training_at_peak the training step's own; saved_act_bytes / amp_weight_copy_bytes are the first
    micro-batch's."""
    rl_phases = {k: v for k, v in phases.items() if v is not None}
    peak_phase_rl = max(rl_phases, key=lambda k: rl_phases[k])
    lora = {"r": o.lora_r, "alpha": 2 * o.lora_r, "targets": o.lora_targets or "default",
            "adapter_dtype": "float32"} if o.lora else None
    config = H.base_config(o.model_name, o.batch, o.max_prompt + o.max_completion, o.precision, "adamw", o.attn,
                           o.gc, o.opt_impl, loss="trl-fused", packing=False, padding=False, trainer_amp=True,
                           lora=lora, **extra_cfg)
    if o.layers_note:
        config["layers_note"] = o.layers_note
    row = H.step_row(config, versions(), sum(p.numel() for p in policy.parameters()), step, t0, after={
        "peak_phase": {"peak_phase_rl": peak_phase_rl, "phases": phases},
        "at_peak": {"training_at_peak": None},
        "phase_peaks": {"phase_details": details}})
    row["training_at_peak"] = row["at_peak"]
    if peak_phase_rl != "training":
        # what is alive at the generation's / the scoring's peak, split as the harness splits a phase's peak
        row["at_peak"] = H.peak_summary({peak_phase_rl: details[peak_phase_rl]["at_peak"]},
                                        row["opt_state_bytes"])[3]
    row.update(peak_bytes=max(rl_phases.values()), saved_act_bytes=step.extra["saved"],
               amp_weight_copy_bytes=step.extra["copies"])
    row["sdpa_kernels"] = dict(H.SDPA_LOG)
    row["value_fallbacks"] = dict(FALLBACKS)
    H.SDPA_LOG.clear()
    return row


# ----------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------
def parser():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--objective", choices=["dpo", "grpo"])
    ap.add_argument("--config")
    ap.add_argument("--model-name")
    ap.add_argument("--precision", choices=["bf16", "amp_bf16"], default="bf16",
                    help="bf16: model_init_kwargs dtype=bfloat16; amp_bf16: TRL's default float32 load; both with "
                    "accelerate's bf16 autocast (the TRL configs' bf16=True)")
    ap.add_argument("--attn", choices=["sdpa", "eager"], default="sdpa")
    ap.add_argument("--gc", choices=["on", "off"], default="on", help="gradient_checkpointing (TRL default: on)")
    ap.add_argument("--opt-impl", choices=list(H.OPT_IMPLS), default="fused",
                    help="AdamW implementation (transformers 5.24 Trainer default optim=adamw_torch_fused)")
    ap.add_argument("--batch", type=int, default=1, help="DPO: per_device_train_batch_size (pairs; 2x rows per forward)")
    ap.add_argument("--max-prompt", type=int, default=512)
    ap.add_argument("--max-completion", type=int, default=512)
    ap.add_argument("--reference", choices=["separate", "adapters-off", "precomputed", "none"], default="separate")
    ap.add_argument("--lora", action="store_true", help="peft LoRA policy (the reference is then adapters-off)")
    ap.add_argument("--lora-r", type=int, default=16)
    ap.add_argument("--lora-targets", default=None, help="default (peft's q_proj,v_proj), all-linear, attention, mlp")
    ap.add_argument("--disable-dropout", action="store_true", help="GRPO: disable_dropout=True (default False)")
    # GRPO
    ap.add_argument("--prompts", type=int, default=1, help="GRPO: prompts per generation batch")
    ap.add_argument("--generations", type=int, default=8, help="GRPO: num_generations")
    ap.add_argument("--steps-per-generation", type=int, default=1,
                    help="GRPO: steps_per_generation (= gradient_accumulation_steps); micro-batch = "
                    "prompts*generations/steps")
    ap.add_argument("--num-iterations", type=int, default=1)
    ap.add_argument("--beta", type=float, default=0.0, help="GRPO: KL coefficient (GRPOConfig default 0.0)")
    ap.add_argument("--loss-type", default="dapo", help="GRPO loss_type (GRPOConfig default dapo)")
    ap.add_argument("--generator", choices=["model", "vllm-colocated", "vllm-server"], default="model")
    ap.add_argument("--vllm-util", type=float, default=0.3, help="vllm_gpu_memory_utilization (default 0.3)")
    ap.add_argument("--vllm-total-gib", type=float, default=80.0, help="device memory for the vLLM reservation figure")
    ap.add_argument("--head-tokens", type=int, default=3, help="GRPO: new tokens generated from the prompt")
    ap.add_argument("--tail-tokens", type=int, default=3, help="GRPO: new tokens generated after the fast-forward")
    ap.add_argument("--full-generation", action="store_true", help="GRPO: no fast-forward (every token generated)")
    ap.add_argument("--layers-note", default=None)
    ap.add_argument("--dump", default=None, help="write what is alive at each phase's peak (storages >= 1 MiB)")
    H.add_run_args(ap)
    return ap


def main(argv=None):
    ap = parser()
    a = ap.parse_args(argv)
    done = H.dispatch(a, __file__, argv_of, main, model_grid=GRID)
    if done is not None:
        return done
    if not (a.config and a.objective):
        ap.error("--config and --objective (or --grid, --from-row) are required")
    import trl
    if trl.__version__ != TRL_VERSION:
        raise SystemExit(f"rl.py needs trl {TRL_VERSION} in {TRL_DIR} (found {trl.__version__} at {trl.__file__}); "
                         f"pip install --no-deps --target {TRL_DIR} trl=={TRL_VERSION}")
    a.gc = a.gc == "on"
    a.model_name = H.model_name(a)
    if a.lora and a.reference == "separate":
        a.reference = "adapters-off"
    if a.reference == "adapters-off" and not a.lora:
        raise SystemExit("--reference adapters-off needs --lora")
    T.install_trainer_patches()
    install_trl_cuda_shims()
    if a.objective == "dpo":
        row, mt = measure_dpo(a)
    else:
        row, mt = measure_grpo(a)
    kernels = row.pop("sdpa_kernels")
    if a.dump:
        with open(a.dump, "w") as f:
            json.dump({"row": row, "sdpa_kernels": kernels, "alive_at_peaks": mt.lists}, f, indent=1)
    fmt = {k: (f"{v / 2**30:.3f}" if v is not None else "-") for k, v in row["phases"].items()}
    return H.emit(row, a.out, f"[rl] {a.model_name} {a.objective} ref={row['config']['reference']} "
                  f"b{row['config']['batch']} P{a.max_prompt} C{a.max_completion} {a.precision} gc={a.gc}: peak "
                  f"{H.gib(row['peak_bytes'])} in {row['peak_phase_rl']} (gen {fmt['generation']}, score "
                  f"{fmt['scoring']}, train {fmt['training']} GiB; train peak in {row['peak_phase']}), sdpa {kernels}, "
                  f"fallbacks {row['value_fallbacks']}, {row['time_s']} s")


GRID_FLAGS = {"objective": "--objective", "model": "--model-name", "batch": "--batch", "precision": "--precision",
              "attn": "--attn", "gc": "--gc", "opt_impl": "--opt-impl", "max_prompt": "--max-prompt",
              "max_completion": "--max-completion", "reference": "--reference", "lora": "--lora",
              "lora_r": "--lora-r", "lora_targets": "--lora-targets", "prompts": "--prompts",
              "generations": "--generations", "steps_per_generation": "--steps-per-generation",
              "num_iterations": "--num-iterations", "beta": "--beta", "loss_type": "--loss-type",
              "generator": "--generator", "vllm_util": "--vllm-util", "vllm_gpu_memory_utilization": "--vllm-util",
              "vllm_total_gib": "--vllm-total-gib", "head_tokens": "--head-tokens", "tail_tokens": "--tail-tokens",
              "full_generation": "--full-generation", "layers_note": "--layers-note"}


def argv_of(entry):
    """The command line (without --config) of a grid entry or a row's config: a row's `lora` is the adapters'
    {r, alpha, targets, ...} (alpha is 2r), and GRPO's `generation_fast_forward: false` with the model
    generating is --full-generation (with C <= head + tail tokens both generate every token)."""
    e = dict(entry)
    if isinstance(e.get("lora"), dict):
        e.update(lora=True, lora_r=e["lora"]["r"], lora_targets=e["lora"]["targets"])
    if e.get("generator") == "model" and e.get("generation_fast_forward") is False:
        e["full_generation"] = True
    return H.flags(e, GRID_FLAGS, on_off=("gc",))


if __name__ == "__main__":
    sys.exit(main())
