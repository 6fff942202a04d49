//! Checks that the allocator replay of an accumulated step no longer changes after
//! `STEADY_PASSES` (4) micro-batches: every preset, over batches, lengths, precisions,
//! checkpointing, optimizer kernels and both allocator modes, 4 against 5, 6, 9 and 32.
//! The replay caps its passes at 4, so this compares the capped replays: run it with the
//! cap raised (e.g. to 64) in `core/src/arch/replay.rs` to check the claim anew.
use estimator_core::{
    estimate_rank_replayed, AllocatorMode, AttentionKernel, Checkpointing, Compile, LossKind, Mesh,
    Optimizer, OptimizerImpl, PrecisionRecipe, Preset, TrainingStep,
};

fn main() {
    let mut same = 0;
    let mut differ = 0;
    for p in Preset::ALL {
        for (batch, seq) in [(1, 512), (2, 1024), (4, 2048), (3, 777)] {
            for precision in [
                PrecisionRecipe::Bf16,
                PrecisionRecipe::AmpBf16,
                PrecisionRecipe::Fp32,
            ] {
                for gc in [Checkpointing::None, Checkpointing::Full] {
                    for imp in [OptimizerImpl::Foreach, OptimizerImpl::Fused] {
                        for mode in [AllocatorMode::Default, AllocatorMode::Expandable] {
                            let Ok(arch) = p.architecture() else { continue };
                            let step = |m| TrainingStep {
                                batch,
                                seq_len: seq,
                                precision,
                                optimizer: Optimizer::AdamW,
                                optimizer_impl: imp,
                                attention: AttentionKernel::Sdpa,
                                checkpointing: gc,
                                compile: Compile::Off,
                                loss: LossKind::Hf,
                                packing: false,
                                padding: false,
                                optimizer_in_backward: false,
                                activation_offload: false,
                                micro_batches: m,
                                kernels: estimator_core::Kernels::Torch,
                            };
                            let r = |m| {
                                estimate_rank_replayed(&arch, &step(m), None, &Mesh::SINGLE, mode)
                                    .ok()
                                    .and_then(|e| e.allocator)
                            };
                            let four = r(4);
                            for m in [5, 6, 9, 32] {
                                if r(m) == four {
                                    same += 1;
                                } else {
                                    differ += 1;
                                    println!("{:?} b{batch} s{seq} {precision:?} {gc:?} {imp:?} {mode:?} m{m}: {:?} vs {:?}", p, r(m), four);
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    println!("{same} replays equal to four micro-batches, {differ} differ");
}
