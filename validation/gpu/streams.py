#!/usr/bin/env python3
"""One rank of FSDP2 or FSDP1 on ONE GPU, over torch's fake process group: what the caching
allocator really reserves on each CUDA stream (issue 34, item 1; validation/DISTRIBUTED.md, "The
engines' streams").

The fake process group (backend "fake", the harness's fake_world) completes every collective at once
and moves nothing, but each rank's tensors, streams, events and record_stream calls are real: rank 0
of a world of W runs on the one GPU exactly as it allocates in a W-GPU job (torchtitan's
COMM_MODE=fake_backend does the same). NCCL's own buffers are absent, as they are from the
estimator's reserve.

The step is the harness's plain model (plain_llama.py, no transformers) wrapped per decoder layer and
at the root, AdamW (foreach), two steps from a fresh allocator: max_memory_allocated() and
max_memory_reserved() over both (the estimator's replay is two steps from the start), and
torch.cuda.memory_snapshot()'s segments summed per stream at the end. The row carries the page query
that describes the same step, for `memest --query Q --json` (reserved_bytes).

  python validation/gpu/streams.py --engine fsdp2 --world 8 --config validation/gpu/models/llama-1b.json \
      --preset llama3.2-1b --batch 2 --seq 2048 --gc [--allocator expandable] [--out rows.jsonl]
  python validation/gpu/streams.py --device cpu ...   the CPU smoke test (a tiny model; no streams)
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

TINY = {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 512}


def parser():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", choices=("fsdp2", "fsdp1"), default="fsdp2")
    ap.add_argument("--wrap", choices=("layers", "none"), default="layers", help="FSDP1's units")
    ap.add_argument("--prefetch", choices=("none", "pre"), default="none", help="FSDP1's backward_prefetch")
    ap.add_argument("--world", type=int, default=8)
    ap.add_argument("--config", default=os.path.join(HERE, "models", "llama-1b.json"))
    ap.add_argument("--preset", default="llama3.2-1b", help="the estimator's preset of the same model")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--gc", action="store_true", help="checkpoint every layer")
    ap.add_argument("--allocator", choices=("default", "expandable"), default="default")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--out", help="append the row to this .jsonl")
    return ap


def query(o):
    """The page query of the same step (mixed bf16: fp32 shards gathered in bf16)."""
    q = {"m": "arch", "model": o.preset, "b": o.batch, "s": o.seq, "r": "mixed-bf16", "o": "adamw",
         "oi": "foreach", "attn": "sdpa", "gc": "full" if o.gc else "none", "gpus": o.world,
         "shard": o.engine, "alloc": o.allocator, "gpu": "h100-80"}
    if o.engine == "fsdp1":
        q.update({"f1w": o.wrap, "bp": o.prefetch})
    return "&".join(f"{k}={v}" for k, v in q.items())


def wrap(model, o, torch, mesh):
    if o.engine == "fsdp2":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh, mp_policy=mp)
        fully_shard(model, mesh=mesh, mp_policy=mp)
        return model
    # FSDP1 as accelerate wraps it: MixedPrecision(bf16, bf16, bf16), FULL_SHARD, limit_all_gathers
    import functools
    from torch.distributed.fsdp import BackwardPrefetch, FullyShardedDataParallel as FSDP, MixedPrecision
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
    import plain_llama
    policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={plain_llama.DecoderLayer}) \
        if o.wrap == "layers" else None
    return FSDP(model, process_group=mesh.get_group(), auto_wrap_policy=policy,
                mixed_precision=MixedPrecision(torch.bfloat16, torch.bfloat16, torch.bfloat16),
                backward_prefetch=BackwardPrefetch.BACKWARD_PRE if o.prefetch == "pre" else None,
                device_id=torch.device(o.device, torch.cuda.current_device()) if o.device == "cuda"
                else torch.device("cpu"),
                limit_all_gathers=True, use_orig_params=False)


def per_stream(torch):
    """Reserved bytes per stream at the end (memory_snapshot's segments), and how many segments."""
    out = {}
    for seg in torch.cuda.memory_snapshot():
        s = str(seg.get("stream", "?"))
        total, n = out.get(s, (0, 0))
        out[s] = (total + seg["total_size"], n + 1)
    return {s: {"reserved_bytes": t, "segments": n} for s, (t, n) in sorted(out.items())}


def measure(o):
    if o.allocator == "expandable":
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    import torch
    from harness.model import build_plain_model, make_optimizer
    from harness.ranks import fake_world
    from torch.distributed.device_mesh import init_device_mesh
    cuda = o.device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise SystemExit("streams.py: no CUDA device (use --device cpu for the smoke test)")
    t0 = time.time()
    with open(o.config) as f:
        cfg = json.load(f)
    if not cuda:
        cfg.update(TINY)
    seq = o.seq if cuda else max(8, o.seq // 64)
    with fake_world(o.world):
        mesh = init_device_mesh(o.device, (o.world,))
        torch.manual_seed(0)
        model = build_plain_model(cfg, torch.float32, torch.device(o.device))
        if o.gc:
            model.gradient_checkpointing_enable()
        model = wrap(model, o, torch, mesh)
        opt = make_optimizer("adamw", [p for p in model.parameters() if p.requires_grad], "foreach")
        vocab = cfg["vocab_size"]
        ids = torch.randint(0, vocab, (o.batch, seq), device=o.device)
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        for _ in range(2):
            loss = model(ids, ids)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            del loss
        row = {"recipe": "validation/gpu/streams.py", "query": query(o), "engine": o.engine, "world": o.world,
               "wrap": o.wrap if o.engine == "fsdp1" else None, "batch": o.batch, "seq": seq, "gc": o.gc,
               "allocator": o.allocator, "torch": torch.__version__, "device": o.device}
        if cuda:
            torch.cuda.synchronize()
            row.update({"device_name": torch.cuda.get_device_name(),
                        "allocated_peak_bytes": torch.cuda.max_memory_allocated(),
                        "reserved_peak_bytes": torch.cuda.max_memory_reserved(),
                        "reserved_end_bytes": torch.cuda.memory_reserved(),
                        "streams_end": per_stream(torch)})
        row["seconds"] = round(time.time() - t0, 2)
    return row


def main(argv=None):
    o = parser().parse_args(argv)
    row = measure(o)
    line = json.dumps(row)
    print(line)
    if o.out:
        with open(o.out, "a") as f:
            f.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
