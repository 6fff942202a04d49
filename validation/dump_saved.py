#!/usr/bin/env python3
"""List every tensor autograd saves for backward in one training forward (+ loss).

Runs the same emulated-CUDA forward as measure.py (the harness's environment: FakeTensorMode,
512-byte rounding, CUDA SDPA kernel choice, CUDA autocast lists) and reports, deduplicated by storage:

  * each saved tensor: the decoder layer it was created in (module hooks), the module path that
    created it, the autograd node(s) + attribute that save it, shape, dtype, storage bytes rounded
    up to 512;
  * tensors saved outside the layers (embeddings, final norm, head, loss, rotary tables, masks);
  * AMP: the bf16 weight copies made by autocast (its cast cache keeps them alive for the whole
    forward; the ones also saved for backward are marked);
  * what is alive at the end of the forward but not saved (masks, rotary tables, ...);
  * a per-layer summary (sum of saved bytes per layer) and a check against MemTracker's
    saved_act_bytes (end-of-forward minus start).

Example:
  python validation/dump_saved.py --config validation/configs/llama-1b.json --layers 2 \
      --batch 1 --seq 64 --precision bf16 --attn sdpa --out /tmp/llama-bf16-sdpa.txt
  (--set key=json_value overrides config fields, e.g. --set sliding_window=32)
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys
import weakref

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as H  # noqa: E402
from harness.model import mlm_or_clm_labels  # noqa: E402

import torch  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils.weak import WeakIdKeyDictionary  # noqa: E402

LAYER_RE = re.compile(r"(?:^|\.)(?:layers|layer|h|blocks)\.(\d+)(?:\.|$)")


def layer_of(path):
    m = LAYER_RE.search(path or "")
    return int(m.group(1)) if m else None


def small_config(cfg: dict, n_layers: int | None, overrides: dict) -> dict:
    """Copy of a published config with n_layers layers; per-layer lists are cut so that every
    distinct entry of the original stays represented (e.g. one sliding + one full layer)."""
    d = dict(cfg)
    if "text_config" in d and isinstance(d["text_config"], dict):
        d["text_config"] = small_config(d["text_config"], n_layers, {})
    if n_layers is not None and "num_hidden_layers" in d and "layer_types" not in d and "model_type" in d:
        # layer_types derived by the config class (e.g. Gemma 3's sliding_window_pattern): take them
        # from the full-size config so the small copy keeps one layer of each type
        try:
            import transformers
            kw = {k: v for k, v in d.items() if k not in ("model_type", "transformers_version")}
            lt = getattr(transformers.AutoConfig.for_model(d["model_type"], **kw), "layer_types", None)
            if isinstance(lt, list) and len(lt) == d["num_hidden_layers"] and len(set(lt)) > 1:
                d["layer_types"] = list(lt)
        except Exception:
            pass
    if n_layers is not None and "num_hidden_layers" in d:
        old = d["num_hidden_layers"]
        d["num_hidden_layers"] = n_layers
        for key in ("layer_types", "no_rope_layers", "sliding_window_layers"):
            v = d.get(key)
            if isinstance(v, list) and len(v) == old:
                d[key] = representative(v, n_layers)
        if isinstance(d.get("max_window_layers"), int) and d["max_window_layers"] >= old:
            d["max_window_layers"] = n_layers
    for k, v in overrides.items():
        d[k] = v
    return d


def load_small(config_path, n_layers, overrides, attn):
    """The config at `config_path` cut to `n_layers` (small_config) with `overrides`: (the dict,
    the transformers config, the architecture)."""
    with open(config_path) as f:
        d = small_config(json.load(f), n_layers, overrides or {})
    with H.config_file(d) as path:
        cfg, arch = H.load_config(path, attn)
    return d, cfg, arch


def module_stack(model):
    """A list that holds, while the model runs, the paths of the modules being called (the
    innermost last): forward pre- and post-hooks on every module."""
    stack = []
    for name, mod in model.named_modules():
        def pre(mod, args, name=name):
            stack.append(name)

        def post(mod, args, out):
            stack.pop()
        mod.register_forward_pre_hook(pre)
        mod.register_forward_hook(post)
    return stack


def storage_names(model, buffers=True):
    """{storage: name} of the model's parameters (and buffers, named "buffer:NAME")."""
    names = WeakIdKeyDictionary()
    for n, p in model.named_parameters():
        names[p.untyped_storage()] = n
    for n, b in (model.named_buffers() if buffers else ()):
        names[b.untyped_storage()] = "buffer:" + n
    return names


def representative(v, n):
    """First n entries, but keep one of each distinct value when the first n do not."""
    out = list(v[:n])
    distinct = list(dict.fromkeys(v))
    if len(set(out)) < min(len(distinct), n):
        out = (distinct + list(v))[:n]
    return out


class OpOutputs(TorchDispatchMode):
    """A dispatch mode that hands every tensor an op returns to `on_output(tensor, storage, op,
    module path)` (the path from `module_stack`), then calls `after_op()`."""

    def __init__(self, stack):
        super().__init__()
        self.stack = stack

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        res = func(*args, **(kwargs or {}))
        path = self.stack[-1] if self.stack else ""
        op = str(func.overloadpacket.__name__) + "." + func._overloadname
        for t in H.tensors_in(res):
            try:
                st = t.untyped_storage()
            except Exception:
                continue
            self.on_output(t, st, op, path)
        self.after_op()
        return res

    def after_op(self):
        pass


class Recorder(OpOutputs):
    """Remembers, for each storage, the op and module path that created it."""

    def __init__(self, stack):
        super().__init__(stack)
        self.created = WeakIdKeyDictionary()
        self.model_level = []

    def on_output(self, t, st, op, path):
        if st not in self.created:
            self.created[st] = (op, path)
            if layer_of(path) is None and st.nbytes() > 0:
                # model-level tensors (masks, rotary tables, embeddings, loss pieces): remember them
                # to report the ones that die before the end of the forward (transients)
                self.model_level.append((weakref.ref(st), op, path, tuple(t.shape),
                                         str(t.dtype).replace("torch.", ""), st.nbytes()))


def run(config_path, batch, seq, precision, attn, n_layers=2, overrides=None, gc=False, build=None):
    """The forward (+ loss) of the model of `config_path` cut to `n_layers`, under saved-tensor hooks
    and the harness's tracker: (info, saved tensors, alive-not-saved). `build(cfg, arch, attn,
    dtype)` makes the model (default: the harness's build_model)."""
    H.install_cuda_emulation()
    d, cfg, arch = load_small(config_path, n_layers, overrides, attn)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    amp = precision == "amp_bf16"
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    packed = []  # (tensor, module path at pack time)
    with fake:
        model = (build or H.build_model)(cfg, arch, attn, dtype)
        if gc:
            model.gradient_checkpointing_enable()
        model.train(True)
        vocab = H.text_vocab(cfg)
        ids = torch.randint(0, vocab, (batch, seq), dtype=torch.long)
        stack = module_stack(model)
        param_st = storage_names(model)
        rec = Recorder(stack)
        rec.created[ids.untyped_storage()] = ("(input ids)", "")
        mt = H.PhaseTracker(H.param_storages(model))
        mt.track_external(model, ids)

        def pack(t):
            packed.append((t, stack[-1] if stack else ""))
            return len(packed) - 1

        cur_node = [None, None]
        sites = collections.defaultdict(list)  # packed index -> [(node, attr)]

        def unpack(i):
            if cur_node[0] is not None:
                sites[i].append((cur_node[0], cur_node[1]))
            return packed[i][0]

        with mt:
            start = mt.snap()
            mt.record_copies = amp
            with rec, torch.autograd.graph.saved_tensors_hooks(pack, unpack):
                ctx = torch.autocast("cpu", dtype=torch.bfloat16) if amp else H.nullctx()
                with ctx:
                    out = model(input_ids=ids, labels=mlm_or_clm_labels(cfg, arch, ids))
                loss = out.loss
                del out
            mt.record_copies = False
            end = mt.snap()
            amp_copy_bytes = mt.alive_copy_bytes() if amp else 0
            amp_copies = []
            for r in mt.copy_refs:
                st = r()
                if st is not None:
                    amp_copies.append(st)
            # walk the graph, reading every saved attribute (unpack hook records the site)
            seen = set()
            todo = [loss.grad_fn]
            while todo:
                node = todo.pop()
                if node is None or id(node) in seen:
                    continue
                seen.add(id(node))
                for attr in dir(node):
                    if attr.startswith("_saved_"):
                        cur_node[0], cur_node[1] = node.name(), attr[len("_saved_"):]
                        try:
                            getattr(node, attr)
                        except Exception:
                            pass
                cur_node[0] = None
                # custom autograd functions (checkpoint, ...): saved_tensors
                if hasattr(node, "saved_tensors"):
                    cur_node[0], cur_node[1] = node.name(), "saved_tensors"
                    try:
                        node.saved_tensors
                    except Exception:
                        pass
                    cur_node[0] = None
                for nxt, _ in node.next_functions:
                    todo.append(nxt)
            # group by storage
            by_st = WeakIdKeyDictionary()
            order = []
            for i, (t, ppath) in enumerate(packed):
                st = t.untyped_storage()
                if st not in by_st:
                    by_st[st] = {"tensors": [], "sites": [], "pack_paths": []}
                    order.append(st)
                e = by_st[st]
                e["tensors"].append(t)
                e["pack_paths"].append(ppath)
                e["sites"].extend(sites.get(i, []))
            rows = []
            for st in order:
                e = by_st[st]
                t = e["tensors"][0]
                op, cpath = rec.created.get(st, ("(before forward)", ""))
                kind = "activation"
                if st in param_st:
                    kind = "param" if not param_st[st].startswith("buffer:") else "buffer"
                elif op in ("(before forward)", "(input ids)"):
                    kind = "input"
                if kind in ("param", "buffer"):
                    op, cpath = param_st[st], ""
                if not e["sites"]:
                    kind += "(unreached)"
                w = mt._WINFO.get(st, (None, None))[0] if hasattr(mt, "_WINFO") else None
                tracked = w.mem_consumed if w is not None else None
                rows.append({
                    "layer": layer_of(cpath), "created_in": cpath, "op": op,
                    "saved_in": sorted(set(e["pack_paths"])),
                    "sites": sorted(set(f"{n}.{a}" for n, a in e["sites"])),
                    "shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", ""),
                    "storage_bytes": st.nbytes(), "bytes": H.rnd(st.nbytes()) if tracked is None else tracked,
                    "kind": kind, "amp_copy": any(st is a for a in amp_copies),
                })
            saved_keys = set(id(s) for s in order)
            # alive at end of forward, not saved: everything MemTracker still holds that was created
            # during the forward
            alive = []
            for st, (w, _) in list(mt._WINFO.items()):
                if id(st) in saved_keys or st in param_st:
                    continue
                if st not in rec.created:
                    continue
                op, cpath = rec.created[st]
                alive.append({"layer": layer_of(cpath), "created_in": cpath, "op": op,
                              "storage_bytes": st.nbytes(), "bytes": w.mem_consumed,
                              "amp_copy": any(st is a for a in amp_copies),
                              "reftype": str(w.reftype).split(".")[-1]})
    transient = [{"created_in": p, "op": op, "shape": list(sh), "dtype": dt, "bytes": H.rnd(nb)}
                 for (r, op, p, sh, dt, nb) in rec.model_level if r() is None]
    info = {
        "config": os.path.basename(config_path), "model_type": cfg.model_type, "arch": arch,
        "batch": batch, "seq": seq, "precision": precision, "attn": attn,
        "n_layers": n_layers, "overrides": overrides or {},
        "saved_act_bytes": end["total"] - start["total"], "amp_weight_copy_bytes": amp_copy_bytes,
        "sdpa_kernels": dict(H.SDPA_LOG), "small_config": d,
    }
    H.SDPA_LOG.clear()
    info["model_level_transients"] = transient
    return info, rows, alive


def fmt_report(info, rows, alive):
    L = []
    o = info["overrides"]
    L.append(f"# {info['config']} ({info['model_type']}, {info['arch']}) {info['n_layers']} layers"
             f"{' overrides ' + json.dumps(o) if o else ''}: batch {info['batch']} seq {info['seq']} "
             f"{info['precision']} attn={info['attn']} sdpa kernels {info['sdpa_kernels']}")
    act = [r for r in rows if r["kind"] == "activation"]
    per = collections.OrderedDict()
    for r in act:
        k = r["layer"] if r["layer"] is not None else "outside"
        per.setdefault(k, [0, 0])
        per[k][0] += r["bytes"]
        per[k][1] += 1
    tot_saved = sum(r["bytes"] for r in act)
    alive_b = sum(a["bytes"] for a in alive)
    L.append("## summary: saved bytes (unique storages, 512-rounded) by the layer that created them")
    for k in sorted(per, key=lambda x: (isinstance(x, str), x)):
        L.append(f"  layer {k}: {per[k][0]:>12} bytes in {per[k][1]} tensors" if k != "outside" else
                 f"  outside layers: {per[k][0]:>12} bytes in {per[k][1]} tensors")
    L.append(f"  total saved activations {tot_saved}; alive-not-saved {alive_b}; sum {tot_saved + alive_b}; "
             f"MemTracker saved_act_bytes {info['saved_act_bytes']} (diff {info['saved_act_bytes'] - tot_saved - alive_b})")
    if info["precision"] == "amp_bf16":
        L.append(f"  amp_weight_copy_bytes (alive bf16 weight casts) {info['amp_weight_copy_bytes']}")
    L.append("## saved tensors (dedup by storage); columns: layer | created in (module) by op | saved by "
             "node.attr | shape dtype | bytes | kind")
    for r in rows:
        lay = "-" if r["layer"] is None else r["layer"]
        extra = " [amp weight copy]" if r["amp_copy"] else ""
        L.append(f"  L{lay:<3} {r['created_in'] or '(model)'} :: {r['op']} | "
                 f"{', '.join(r['sites']) or '?'} (in {', '.join(p or '(model)' for p in r['saved_in'])}) | "
                 f"{r['shape']} {r['dtype']} | {r['bytes']} | {r['kind']}{extra}")
    L.append("## alive at end of forward but not saved for backward")
    for a in alive:
        lay = "-" if a["layer"] is None else a["layer"]
        L.append(f"  L{lay:<3} {a['created_in'] or '(model)'} :: {a['op']} | {a['bytes']} bytes "
                 f"({a['reftype']}){' [amp weight copy]' if a['amp_copy'] else ''}")
    L.append("## created outside the layers during the forward and freed before its end (model-level "
             "transients, e.g. HF masks; >= 512 B)")
    for t in info.get("model_level_transients", []):
        L.append(f"  {t['created_in'] or '(model)'} :: {t['op']} | {t['shape']} {t['dtype']} | {t['bytes']}")
    return "\n".join(L) + "\n"


def overrides(sets):
    """`--set key=value` options as config overrides: the value as JSON, else as a string."""
    ov = {}
    for s in sets:
        k, _, v = s.partition("=")
        try:
            ov[k] = json.loads(v)
        except json.JSONDecodeError:
            ov[k] = v
    return ov


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True)
    ap.add_argument("--layers", type=int, default=2, help="num_hidden_layers of the copy (0 = keep)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--precision", choices=["fp32", "amp_bf16", "bf16"], default="bf16")
    ap.add_argument("--attn", choices=["sdpa", "eager"], default="sdpa")
    ap.add_argument("--gc", action="store_true")
    ap.add_argument("--set", action="append", default=[], help="key=json value config override")
    ap.add_argument("--out", help="write the report here (default stdout)")
    ap.add_argument("--json", help="also write the rows as JSON here")
    a = ap.parse_args(argv)
    info, rows, alive = run(a.config, a.batch, a.seq, a.precision, a.attn, a.layers or None, overrides(a.set),
                            a.gc)
    text = fmt_report(info, rows, alive)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"info": info, "saved": rows, "alive_not_saved": alive}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
