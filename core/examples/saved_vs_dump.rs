//! Compares the estimator's saved activations with `validation/dump_saved.py --json` dumps:
//! `cargo run -p estimator-core --example saved_vs_dump -- DIR_OF_JSON_DUMPS`. A row that
//! differs is a tensor the model misses or adds; the dump lists every saved tensor to find it.
use estimator_core::*;
fn main() {
    let dir = std::env::args()
        .nth(1)
        .unwrap_or("/tmp/harness/dumps/json".into());
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    names.sort();
    for p in names {
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        let i = &v["info"];
        let cfg = i["small_config"].to_string();
        let arch = match parse_hf_config(&cfg) {
            Ok(a) => a,
            Err(e) => {
                println!("{:?}: {e}", p.file_name());
                continue;
            }
        };
        let prec = match i["precision"].as_str().unwrap() {
            "fp32" => PrecisionRecipe::Fp32,
            "bf16" => PrecisionRecipe::Bf16,
            _ => PrecisionRecipe::AmpBf16,
        };
        let step = TrainingStep {
            batch: i["batch"].as_u64().unwrap(),
            seq_len: i["seq"].as_u64().unwrap(),
            precision: prec,
            optimizer: Optimizer::AdamW,
            optimizer_impl: estimator_core::OptimizerImpl::Foreach,
            attention: AttentionKernel::from_key(i["attn"].as_str().unwrap()).unwrap(),
            checkpointing: Checkpointing::None,
            compile: estimator_core::Compile::Off,
            loss: estimator_core::LossKind::Hf,
            packing: false,
            padding: false,
            optimizer_in_backward: false,
            activation_offload: false,
            micro_batches: 1,
            kernels: estimator_core::Kernels::Torch,
        };
        let meas = i["saved_act_bytes"].as_u64().unwrap() as i64;
        match estimate_peak(&arch, &step) {
            Ok(e) => {
                let d = e.saved_activation_bytes as i64 - meas;
                println!(
                    "{:45} meas {:>12} est {:>12} diff {:>10} ({:+.2}%)",
                    p.file_name().unwrap().to_string_lossy(),
                    meas,
                    e.saved_activation_bytes,
                    d,
                    d as f64 / meas as f64 * 100.0
                )
            }
            Err(e) => println!("{:?}: {e}", p.file_name()),
        }
    }
}
