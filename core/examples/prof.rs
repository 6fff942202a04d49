//! One cold run of a page operation, for a profiler (`valgrind --tool=callgrind`): the
//! advisor after a typing pause, or the architecture keystroke (a batch never seen).
//!
//! `cargo build --release -p estimator-core --example prof` (with `CARGO_PROFILE_RELEASE_DEBUG=true`
//! and `CARGO_PROFILE_RELEASE_STRIP=false` for names and lines), then
//! `valgrind --tool=callgrind target/release/examples/prof advisor|keystroke|replay`.
use std::hint::black_box;

use estimator_core::{decode_query, evaluate, fit_advice};

fn main() {
    let what = std::env::args().nth(1).unwrap_or_default();
    match what.as_str() {
        "advisor" => {
            let s = decode_query("m=arch&model=llama3-8b&gpu=rtx4090&b=1&s=2000").state;
            let plans = fit_advice(black_box(&s), 5).expect("plans");
            for p in &plans {
                println!(
                    "{:?} peak {} max {:?}",
                    p.changes, p.peak_bytes, p.max_batch
                );
            }
        }
        "keystroke" => {
            // the page as the browser benchmark leaves it, then one new batch
            let q = "m=arch&model=llama3-8b&s=2048&gpu=h100-80&n=8&shard=zero2";
            let first = decode_query(&format!("{q}&b=4")).state;
            black_box(evaluate(&first).ok());
            let start = std::time::Instant::now();
            let next = decode_query(&format!("{q}&b=5")).state;
            let e = evaluate(black_box(&next)).expect("evaluates");
            eprintln!("{:?}", start.elapsed());
            println!("peak {} max {:?}", e.step.peak_bytes, e.max_batch);
        }
        "replay" => {
            // one plan of the advisor's: checkpointed, LoRA, on one 24 GB GPU
            let arch = estimator_core::Preset::from_key("llama3-8b")
                .and_then(|p| p.architecture().ok())
                .expect("preset");
            let step = estimator_core::TrainingStep {
                batch: 3,
                seq_len: 2000,
                precision: estimator_core::PrecisionRecipe::MixedBf16,
                optimizer: estimator_core::Optimizer::AdamW,
                optimizer_impl: estimator_core::OptimizerImpl::Fused,
                attention: estimator_core::AttentionKernel::Sdpa,
                checkpointing: estimator_core::Checkpointing::Full,
                compile: estimator_core::Compile::Off,
                loss: estimator_core::LossKind::Hf,
                packing: false,
                padding: false,
                optimizer_in_backward: false,
                activation_offload: false,
                micro_batches: 1,
                kernels: estimator_core::Kernels::Torch,
            };
            let n: u32 = std::env::args()
                .nth(2)
                .and_then(|n| n.parse().ok())
                .unwrap_or(1);
            for _ in 0..n {
                let e = estimator_core::estimate_rank_replayed(
                    &arch,
                    black_box(&step),
                    None,
                    &estimator_core::Mesh::SINGLE,
                    estimator_core::AllocatorMode::Default,
                )
                .expect("estimates");
                black_box(e.allocator);
            }
        }
        _ => eprintln!("usage: prof advisor|keystroke|replay [n]"),
    }
}
