//! Benchmark of the core's recompute: what one input change costs the page.
//!
//! `cargo run --release -p estimator-core --example bench`. Prints the median time of each
//! operation over many runs; figures, not pass/fail.

use std::hint::black_box;
use std::time::{Duration, Instant};

use estimator_core::{
    decode_query, estimate_peak, evaluate, fit_advice, max_batch_that_fits, simple_breakdown,
    simple_breakdown_at_batch, sweep, sweep_markdown, ByteUnit, Overheads, SweepRow, MAX_BATCH,
};

fn median_time(runs: usize, mut f: impl FnMut()) -> Duration {
    let mut times: Vec<Duration> = (0..runs)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed()
        })
        .collect();
    times.sort_unstable();
    times[times.len() / 2]
}

fn report(name: &str, runs: usize, f: impl FnMut()) {
    let t = median_time(runs, f);
    println!("{name:<58} {:>10.2} µs", t.as_secs_f64() * 1e6);
}

fn main() {
    let simple = decode_query("p=7&pu=B&b=8&a=512&gpu=h100-80").state;
    let inputs = simple.simple_inputs().expect("valid");
    report("simple: breakdown", 10_000, || {
        black_box(simple_breakdown(black_box(&inputs)).ok());
    });
    report("simple: breakdown + sweep + markdown table", 10_000, || {
        let rows = sweep(inputs.batch, MAX_BATCH, |b| {
            simple_breakdown_at_batch(&inputs, b).map(|x| SweepRow {
                batch: b,
                model_state_bytes: x.model_state_bytes(),
                activation_bytes: x.activations,
                total_bytes: x.total,
                peak_phase: None,
                is_selected: false,
                fits: None,
                tokens: None,
            })
        });
        black_box(sweep_markdown(&rows, ByteUnit::Gb));
    });
    report(
        "simple: whole page evaluate (sweep, verdict, max batch)",
        2_000,
        || {
            black_box(evaluate(black_box(&simple)).ok());
        },
    );

    let arch_state = decode_query(
        "m=arch&model=llama3-8b&b=4&s=2048&r=amp-bf16&gpu=h100-80&n=8&shard=zero2&gb=512",
    )
    .state;
    let arch = arch_state.architecture().expect("preset");
    let step = estimator_core::TrainingStep {
        batch: 4,
        seq_len: 2048,
        precision: estimator_core::PrecisionRecipe::AmpBf16,
        optimizer: estimator_core::Optimizer::AdamW,
        optimizer_impl: estimator_core::OptimizerImpl::Foreach,
        attention: estimator_core::AttentionKernel::Sdpa,
        checkpointing: estimator_core::Checkpointing::None,
        compile: estimator_core::Compile::Off,
        loss: estimator_core::LossKind::Hf,
        packing: false,
        padding: false,
        optimizer_in_backward: false,
        activation_offload: false,
        micro_batches: 1,
        kernels: estimator_core::Kernels::Torch,
    };
    report(
        "architecture: one peak estimate (Llama-3-8B)",
        2_000,
        || {
            black_box(estimate_peak(black_box(&arch), &step).ok());
        },
    );
    let gpt2 = estimator_core::Preset::from_key("gpt2")
        .and_then(|p| p.architecture().ok())
        .expect("preset");
    let gpt2_step = estimator_core::TrainingStep {
        seq_len: 1024,
        ..step
    };
    report(
        "architecture: largest-batch search (GPT-2, H100 80 GB)",
        500,
        || {
            black_box(
                max_batch_that_fits(MAX_BATCH, 81_559 << 20, &Overheads::default(), |b| {
                    estimate_peak(
                        &gpt2,
                        &estimator_core::TrainingStep {
                            batch: b,
                            ..gpt2_step
                        },
                    )
                    .map(|e| e.peak_bytes)
                })
                .ok(),
            );
        },
    );
    report(
        "architecture: whole page evaluate (sweep, verdict, search)",
        500,
        || {
            black_box(evaluate(black_box(&arch_state)).ok());
        },
    );
    // The example: full fine-tuning does not fit one 24 GB card.
    let advise = decode_query("m=arch&model=llama3-8b&s=2048&b=8&r=amp-bf16&gpu=rtx4090").state;
    report("advisor: Llama-3-8B on a 24 GB GPU (5 plans)", 200, || {
        black_box(fit_advice(black_box(&advise), 5).ok());
    });
    // What the browser benchmark measures: each run a sequence never seen, so that no
    // allocator replay is cached from the run before.
    let mut seq = 2000;
    report(
        "advisor: Llama-3-8B on an RTX 4090, cold replays (5 plans)",
        50,
        || {
            seq += 1;
            let q = format!("m=arch&model=llama3-8b&gpu=rtx4090&b=1&s={seq}");
            black_box(fit_advice(black_box(&decode_query(&q).state), 5).ok());
        },
    );
    // The longest sequence that fits (the page asks once the inputs rest): each run a new
    // batch, so that its replays are not cached from the run before.
    let mut batch = 0;
    report(
        "longest sequence: Llama-3-8B QLoRA on an RTX 4090, cold replays",
        30,
        || {
            batch += 1;
            let q = format!(
                "m=arch&model=llama3-8b&s=2048&b={batch}&r=amp-bf16&gc=full&method=qlora&o=paged-adamw8bit&gpu=rtx4090"
            );
            let s = estimator_core::Scenario::parse(&decode_query(&q).state).expect("valid");
            black_box(s.longest_sequence());
        },
    );
    let advise_70b = decode_query("m=arch&model=llama3-70b&s=2048&b=1&gpu=rtx4090").state;
    report("advisor: Llama-3-70B on a 24 GB GPU (5 plans)", 100, || {
        black_box(fit_advice(black_box(&advise_70b), 5).ok());
    });
    let config = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/configs/llama3-8b.json"
    ))
    .expect("fixture");
    report("config.json: parse (Llama-3-8B)", 5_000, || {
        black_box(estimator_core::parse_hf_config(black_box(&config)).ok());
    });
    // serving: one vLLM start-up, and with the changes that let it start (seven start-ups)
    let serving = decode_query("m=arch&model=llama3.1-8b&o=none&gpu=rtx4090&srv=on").state;
    let scenario = estimator_core::Scenario::parse(&serving).expect("valid");
    report(
        "serve: vLLM start-up (Llama-3.1-8B on a 24 GB GPU)",
        5_000,
        || {
            black_box(black_box(&scenario).serve());
        },
    );
    report(
        "serve: start-up + what lets it start (131k does not fit)",
        1_000,
        || {
            let s = black_box(&scenario);
            if let Some(Ok(now)) = s.serve() {
                black_box(s.serve_advice(&serving, &now));
            }
        },
    );
}
