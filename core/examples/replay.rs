//! Prints the allocator replay of a few steps: allocated and reserved peaks, both modes.
use estimator_core::{
    estimate_rank_replayed, AllocatorMode, AttentionKernel, Checkpointing, Compile, LossKind, Mesh,
    Optimizer, OptimizerImpl, PrecisionRecipe, Preset, TrainingStep,
};

fn main() {
    for (key, batch, seq, precision, gc, imp) in [
        (
            "llama3.2-1b",
            1,
            2048,
            PrecisionRecipe::Bf16,
            false,
            OptimizerImpl::Foreach,
        ),
        (
            "llama3.2-1b",
            4,
            2048,
            PrecisionRecipe::Bf16,
            false,
            OptimizerImpl::Foreach,
        ),
        (
            "llama3.2-1b",
            4,
            2048,
            PrecisionRecipe::AmpBf16,
            false,
            OptimizerImpl::Fused,
        ),
        (
            "llama3.2-1b",
            8,
            4096,
            PrecisionRecipe::Bf16,
            true,
            OptimizerImpl::Foreach,
        ),
        (
            "qwen3-0.6b",
            4,
            2048,
            PrecisionRecipe::Bf16,
            false,
            OptimizerImpl::Fused,
        ),
        (
            "llama3-8b",
            1,
            2048,
            PrecisionRecipe::Bf16,
            false,
            OptimizerImpl::Fused,
        ),
        (
            "llama3-8b",
            4,
            4096,
            PrecisionRecipe::Bf16,
            true,
            OptimizerImpl::Foreach,
        ),
    ] {
        let arch = Preset::from_key(key).unwrap().architecture().unwrap();
        let step = TrainingStep {
            batch,
            seq_len: seq,
            precision,
            optimizer: Optimizer::AdamW,
            optimizer_impl: imp,
            attention: AttentionKernel::Sdpa,
            checkpointing: if gc {
                Checkpointing::Full
            } else {
                Checkpointing::None
            },
            loss: LossKind::Hf,
            packing: false,
            padding: false,
            optimizer_in_backward: false,
            activation_offload: false,
            micro_batches: 1,
            compile: Compile::Off,
            kernels: estimator_core::Kernels::Torch,
        };
        for mode in AllocatorMode::ALL {
            let t = std::time::Instant::now();
            let e = estimate_rank_replayed(&arch, &step, None, &Mesh::SINGLE, mode).unwrap();
            let el = t.elapsed();
            let r = e.allocator.unwrap();
            println!(
                "{key} b{batch} s{seq} {precision:?} gc={gc} {imp:?} {mode:?}: peak {:.3} GiB, replay alloc {:.3} reserved {:.3} (+{:.2}%) in {:?}",
                e.peak_bytes as f64 / 1073741824.0,
                r.allocated_bytes as f64 / 1073741824.0,
                r.reserved_bytes as f64 / 1073741824.0,
                r.slack_bytes() as f64 * 100.0 / e.peak_bytes as f64,
                el
            );
        }
    }
}
