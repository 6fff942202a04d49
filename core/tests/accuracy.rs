//! Estimated peaks against PyTorch's measured ones (tests/fixtures/*.jsonl).

use estimator_core::{
    estimate_peak, estimate_peak_with, parse_hf_config, Architecture, AttentionKernel,
    Checkpointing, Method, Optimizer, OptimizerImpl, Peft, PrecisionRecipe, Preset, Quant4,
    TrainingStep,
};
use proptest::prelude::*;
use serde_json::Value;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");

fn architecture(model: &str) -> Option<Architecture> {
    let preset = match model {
        "llama-1b" => Preset::from_key("llama3.2-1b"),
        "phi3-mini-4k" => Preset::from_key("phi3-mini"),
        other => Preset::from_key(other),
    };
    if let Ok(text) = std::fs::read_to_string(format!("{FIXTURES}/configs/{model}.json")) {
        if let Ok(a) = parse_hf_config(&text) {
            return Some(a);
        }
    }
    preset.and_then(|p| p.architecture().ok())
}

/// The implementation a row's `opt_impl` names (bitsandbytes' and transformers' optimizers
/// have their own kernels: the implementation does not apply to them).
fn optimizer_impl(text: &str) -> OptimizerImpl {
    if text.starts_with("fused") {
        OptimizerImpl::Fused
    } else if text.starts_with("forloop") || text.starts_with("single_tensor") {
        OptimizerImpl::ForLoop
    } else {
        OptimizerImpl::Foreach
    }
}

struct Row {
    family: &'static str,
    name: String,
    measured: u64,
    estimated: u64,
    measured_phase: String,
    estimated_phase: &'static str,
    measured_saved: u64,
    estimated_saved: u64,
    compile: estimator_core::Compile,
    /// The optimizer step's peak (model states alone), measured and estimated.
    measured_opt: u64,
    estimated_opt: u64,
    /// The forward's peak, measured and estimated.
    measured_fwd: u64,
    estimated_fwd: u64,
}

/// Rows of `file`; with `strict`, any row that cannot be estimated fails the test, otherwise
/// it is reported and skipped.
fn rows(file: &str, strict: bool) -> Vec<Row> {
    let path = if file.starts_with('/') {
        file.to_string()
    } else {
        format!("{FIXTURES}/{file}")
    };
    let Ok(text) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let v: Value = serde_json::from_str(line).expect("valid JSON line");
        let c = &v["config"];
        let model = c["model"].as_str().expect("model");
        if model.starts_with("resnet") {
            continue;
        }
        let Some(arch) = architecture(model) else {
            assert!(!strict, "no architecture for {model}");
            println!("skipped {model}: no config or preset");
            continue;
        };
        let precision = match c["precision"].as_str().expect("precision") {
            "fp32" => PrecisionRecipe::Fp32,
            "amp_bf16" => PrecisionRecipe::AmpBf16,
            "amp_fp16" => PrecisionRecipe::AmpFp16,
            "bf16" => PrecisionRecipe::Bf16,
            p => panic!("unknown precision {p}"),
        };
        let optimizer = match c["optimizer"].as_str().expect("optimizer") {
            "sgd" => Optimizer::SgdMomentum,
            // torch.optim.Adam (measured beside AdamW for its coupled weight decay) is not
            // one of the page's optimizers
            "adam" => {
                println!("skipped {model}: torch.optim.Adam");
                continue;
            }
            o => Optimizer::from_key(o).unwrap_or_else(|| panic!("unknown optimizer {o}")),
        };
        let attention =
            AttentionKernel::from_key(c["attn"].as_str().expect("attn")).expect("kernel");
        let checkpointing = match (&c["gc"], c["gc_policy"].as_str()) {
            // transformers' own every-Nth rule (layers 0, N, ...) is not torchtitan's
            (_, Some(policy)) if policy.starts_with("hf-") => {
                println!("skipped {model}: gc_policy {policy}");
                continue;
            }
            // every first layer is every layer
            (Value::Bool(true), Some("every:1")) => Checkpointing::Full,
            (Value::Bool(true), Some(policy)) => {
                Checkpointing::from_key(policy).expect("a checkpointing key")
            }
            (Value::Bool(true), None) => Checkpointing::Full,
            (Value::String(s), _) if s == "offload" => Checkpointing::Offload,
            _ => Checkpointing::None,
        };
        let compile = estimator_core::Compile::from_key(c["compile"].as_str().unwrap_or("off"))
            .expect("compile");
        let method = Method::from_key(c["method"].as_str().unwrap_or("full")).expect("method");
        let peft = (method != Method::Full).then(|| Peft {
            method,
            rank: c["lora_r"].as_u64().expect("lora_r"),
            dropout: c["lora_dropout"].as_f64().unwrap_or(0.0) > 0.0,
            targets: arch
                .lora_targets(c["lora_targets"].as_str().expect("lora_targets"))
                .expect("targets"),
            adapter_fp32: c["lora_dtype"].as_str() != Some("model"),
            quant: Quant4::from_key(c["quant"].as_str().unwrap_or("nf4")).expect("quant"),
            double_quant: c["double_quant"].as_bool().unwrap_or(false),
            kbit_prepare: c["kbit_prepare"].as_bool().unwrap_or(false),
            base_fp32: c["base_dtype"].as_str() == Some("fp32"),
        });
        let seq = if arch.is_vision() {
            c["image"].as_u64()
        } else {
            c["seq"].as_u64()
        }
        .expect("seq");
        let step = TrainingStep {
            batch: c["batch"].as_u64().expect("batch"),
            seq_len: seq,
            precision,
            optimizer,
            optimizer_impl: optimizer_impl(c["opt_impl"].as_str().unwrap_or("foreach")),
            attention,
            checkpointing,
            compile,
            loss: estimator_core::LossKind::from_key(c["loss"].as_str().unwrap_or("hf"))
                .expect("loss"),
            packing: c["packing"].as_bool().unwrap_or(false),
            padding: c["padding"].as_bool().unwrap_or(false),
            optimizer_in_backward: c["optimizer_in_bwd"].as_bool().unwrap_or(false),
            activation_offload: c["activation_offload"].as_bool().unwrap_or(false),
            micro_batches: c["micro_batches"].as_u64().unwrap_or(1),
            kernels: estimator_core::Kernels::Torch,
        };
        let est = match estimate_peak_with(&arch, &step, peft.as_ref()) {
            Ok(e) => e,
            Err(e) => {
                assert!(!strict, "{model}: {e}");
                println!("skipped {model}: {e}");
                continue;
            }
        };
        if let Some(n) = v["n_params"].as_u64() {
            assert_eq!(est.n_params, n, "parameter count of {model}");
        }
        out.push(Row {
            family: arch.family().label(),
            name: format!(
                "{model} b{}{} s{seq}{} {} {} {}{}{}{}",
                step.batch,
                if step.micro_batches > 1 {
                    format!(" x{} micro-batches", step.micro_batches)
                } else {
                    String::new()
                },
                trainer_settings(&step, c["gc_reentrant"].as_bool().unwrap_or(false)),
                precision.key(),
                match step.optimizer_impl {
                    OptimizerImpl::Foreach => optimizer.key().to_owned(),
                    i => format!("{}-{}", optimizer.key(), i.key()),
                },
                attention.key(),
                match checkpointing {
                    Checkpointing::None => String::new(),
                    Checkpointing::Full => " gc".to_owned(),
                    Checkpointing::Offload => " gc-offload".to_owned(),
                    c => format!(" gc={}", c.key()),
                },
                match compile {
                    estimator_core::Compile::Off => String::new(),
                    c => format!(" compile={}", c.key()),
                },
                peft.map_or(String::new(), |f| format!(
                    " {} r{} {}{}{}{}{}",
                    f.method.key(),
                    f.rank,
                    c["lora_targets"].as_str().unwrap_or("?"),
                    if f.dropout { " dropout" } else { "" },
                    if f.adapter_fp32 {
                        ""
                    } else {
                        " adapters=model"
                    },
                    if f.base_fp32 { " base=fp32" } else { "" },
                    if f.method == Method::Qlora {
                        format!(
                            " {}{}{}",
                            f.quant.key(),
                            if f.double_quant { " dq" } else { "" },
                            if f.kbit_prepare { " kbit" } else { "" }
                        )
                    } else {
                        String::new()
                    }
                ))
            ),
            measured: v["peak_bytes"].as_u64().expect("peak_bytes"),
            estimated: est.peak_bytes,
            measured_phase: v["peak_phase"].as_str().unwrap_or("?").to_string(),
            estimated_phase: est.peak_phase.key(),
            measured_saved: v["saved_act_bytes"].as_u64().unwrap_or(0),
            estimated_saved: est.saved_activation_bytes,
            compile,
            measured_opt: v["phase_peak_bytes"]["opt"].as_u64().unwrap_or(0),
            estimated_opt: phase_total(&est, estimator_core::Phase::OptimizerStep),
            measured_fwd: v["phase_peak_bytes"]["fwd"].as_u64().unwrap_or(0),
            estimated_fwd: phase_total(&est, estimator_core::Phase::Forward),
        });
    }
    out
}

/// The estimate's peak in `phase` (0 where it has none).
fn phase_total(est: &estimator_core::PeakEstimate, phase: estimator_core::Phase) -> u64 {
    est.phase_peaks
        .iter()
        .find(|(p, _)| *p == phase)
        .and_then(|(_, c)| c.total())
        .unwrap_or(0)
}

fn error_pct(r: &Row) -> f64 {
    (r.estimated as f64 - r.measured as f64) / r.measured as f64 * 100.0
}

fn report(title: &str, rows: &[Row]) -> f64 {
    println!("\n{title}");
    println!("| configuration | measured | estimated | error | phase (measured/estimated) | saved activations error |");
    println!("|---|---:|---:|---:|---|---:|");
    let mut worst: f64 = 0.0;
    let mut sum = 0.0;
    for r in rows {
        let e = error_pct(r);
        worst = worst.max(e.abs());
        sum += e.abs();
        let saved = (r.estimated_saved as f64 - r.measured_saved as f64)
            / r.measured_saved.max(1) as f64
            * 100.0;
        println!(
            "| {} | {} | {} | {:+.2}% | {}/{} | {:+.2}% |",
            r.name, r.measured, r.estimated, e, r.measured_phase, r.estimated_phase, saved
        );
    }
    if !rows.is_empty() {
        println!(
            "max |error| {worst:.2}%, mean |error| {:.2}% over {} rows",
            sum / rows.len() as f64,
            rows.len()
        );
    }
    worst
}

/// The measured fixtures: the shared reference data, the harness's re-measured and extra rows
/// for the first families, and the rows of the dense and mixture-of-experts families read
/// since.
const FIXTURE_FILES: [&str; 10] = [
    "pytorch-measured.jsonl",
    "validation-measured.jsonl",
    "families-measured.jsonl",
    "moe-measured.jsonl",
    "peft-measured.jsonl",
    "trainers-measured.jsonl",
    "variants-measured.jsonl",
    "compile-inductor-measured.jsonl",
    "accumulation-measured.jsonl",
    AUTOCAST_FILE,
];

/// Steps under autocast on a frozen base, beside a full fine-tune's, and bases loaded in fp32
/// (`validation/grid-autocast.json`).
const AUTOCAST_FILE: &str = "autocast-measured.jsonl";

/// autocast caches the 16-bit cast of a weight only when it requires grad (aten's
/// `cached_cast`): a checkpointed forward holds the adapters' copies (a full fine-tune's: every
/// weight's) until it returns, never a frozen base's. The forward's peak holds to 3% beside the
/// step's, so that the cache is checked where the step peaks elsewhere.
#[test]
fn autocast_caches_only_the_weights_that_require_grad() {
    let all = rows(AUTOCAST_FILE, true);
    assert!(all.len() >= 10, "autocast rows missing");
    let pct = |est: u64, measured: u64| (est as f64 - measured as f64) / measured as f64 * 100.0;
    println!("\n{AUTOCAST_FILE}: the forward's peak");
    println!("| configuration | measured | estimated | error |");
    println!("|---|---:|---:|---:|");
    let mut failing = Vec::new();
    for r in &all {
        let fwd = pct(r.estimated_fwd, r.measured_fwd);
        println!(
            "| {} | {} | {} | {fwd:+.2}% |",
            r.name, r.measured_fwd, r.estimated_fwd
        );
        if fwd.abs() > 3.0 {
            failing.push(format!("{}: forward {fwd:+.2}%", r.name));
        }
        if error_pct(r).abs() > 3.0 {
            failing.push(format!("{}: peak {:+.2}%", r.name, error_pct(r)));
        }
    }
    assert!(failing.is_empty(), "{failing:#?}");
}

/// Steps under `torch.compile` (`validation/COMPILE.md`), each beside its eager row.
const COMPILE_FILE: &str = "compile-measured.jsonl";

/// The compiled rows: the saved activations are what inductor keeps (the partitioner's
/// choice, identical under the decomposed graph the rows ran and under inductor), so they
/// hold to 3%. The measured peaks ran the decomposed graph op by op, where inductor fuses
/// the pointwise chains and never makes the loss's fp32 vocabulary-sized buffers: they are
/// upper bounds on the transients. So the estimated peak must not exceed the measured one
/// by more than 3%, and the optimizer step (model states alone) holds to 3%. A row whose
/// measured peak is the optimizer step (set by model states alone) holds to 3% outright;
/// none so far: every compiled row peaks in the loss's decomposed backward.
#[test]
fn compiled_steps_keep_what_the_partitioner_saves() {
    let all = rows(COMPILE_FILE, true);
    let compiled: Vec<&Row> = all
        .iter()
        .filter(|r| r.compile != estimator_core::Compile::Off)
        .collect();
    assert!(compiled.len() >= 3, "compiled rows missing");
    report(COMPILE_FILE, &all);
    let pct = |est: u64, measured: u64| (est as f64 - measured as f64) / measured as f64 * 100.0;
    let mut failing = Vec::new();
    for r in &compiled {
        let saved = pct(r.estimated_saved, r.measured_saved);
        if saved.abs() > 3.0 {
            failing.push(format!("{}: saved {saved:+.2}%", r.name));
        }
        let opt = pct(r.estimated_opt, r.measured_opt);
        if opt.abs() > 3.0 {
            failing.push(format!("{}: optimizer step {opt:+.2}%", r.name));
        }
        let peak = error_pct(r);
        if peak > 3.0 || (r.measured_phase == "opt" && peak.abs() > 3.0) {
            failing.push(format!("{}: peak {peak:+.2}%", r.name));
        }
    }
    assert!(failing.is_empty(), "{failing:#?}");
}

/// The trainers' settings of a step that are not at transformers' defaults, for the table.
fn trainer_settings(step: &TrainingStep, reentrant: bool) -> String {
    let mut out = String::new();
    if step.loss != estimator_core::LossKind::Hf {
        out += " ";
        out += step.loss.key();
    }
    for (on, name) in [
        (step.packing, " packed"),
        (step.padding, " padded"),
        (step.optimizer_in_backward, " optimizer-in-bwd"),
        (step.activation_offload, " offloaded"),
        (reentrant, " reentrant-gc"),
    ] {
        if on {
            out += name;
        }
    }
    out
}

/// Rows, max and mean |error| per family.
fn family_table(rows: &[Row]) {
    let mut families: Vec<&str> = rows.iter().map(|r| r.family).collect();
    families.sort_unstable();
    families.dedup();
    println!("\nper family");
    println!("| family | rows | max abs error | mean abs error |");
    println!("|---|---:|---:|---:|");
    for f in families {
        let errors: Vec<f64> = rows
            .iter()
            .filter(|r| r.family == f)
            .map(|r| error_pct(r).abs())
            .collect();
        let max = errors.iter().copied().fold(0.0, f64::max);
        let mean = errors.iter().sum::<f64>() / errors.len() as f64;
        println!("| {f} | {} | {max:.2}% | {mean:.2}% |", errors.len());
    }
}

#[test]
fn every_measured_transformer_is_within_three_percent() {
    let reference = rows("pytorch-measured.jsonl", true);
    assert!(reference.len() > 80, "fixture rows missing");
    let mut all = Vec::new();
    for file in FIXTURE_FILES {
        let rows = rows(file, true);
        report(file, &rows);
        all.extend(rows);
    }
    // the eager rows measured beside the compiled ones (the compiled rows are held by
    // `compiled_steps_keep_what_the_partitioner_saves`)
    let eager: Vec<Row> = rows(COMPILE_FILE, true)
        .into_iter()
        .filter(|r| r.compile == estimator_core::Compile::Off)
        .collect();
    report(COMPILE_FILE, &eager);
    all.extend(eager);
    // more rows of the same format, e.g. fresh measurements: reported, never asserted
    if let Ok(extra) = std::env::var("ESTIMATOR_EXTRA_ROWS") {
        report(&extra, &rows(&extra, false));
    }
    family_table(&all);
    let failing: Vec<String> = all
        .iter()
        .filter(|r| error_pct(r).abs() > 3.0)
        .map(|r| format!("{}: {:+.2}%", r.name, error_pct(r)))
        .collect();
    assert!(failing.is_empty(), "beyond 3%: {failing:#?}");
}

#[test]
fn presets_round_trip_through_config_json() {
    for p in Preset::ALL {
        let a = p.architecture().expect("preset parses");
        assert_eq!(
            parse_hf_config(&a.to_config_json()).as_ref(),
            Ok(&a),
            "{}",
            p.key()
        );
    }
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<u64>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        (0u64..5000).prop_map(Value::from),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        "[a-z0-9_]{0,8}".prop_map(Value::String),
        prop_oneof![
            Just("gpt2"),
            Just("llama"),
            Just("qwen2"),
            Just("gemma"),
            Just("phi3"),
            Just("bert"),
            Just("vit"),
            Just("mistral")
        ]
        .prop_map(|s| Value::String(s.to_string())),
    ];
    leaf.prop_recursive(2, 16, 4, |inner| {
        prop::collection::vec(inner, 0..4).prop_map(Value::Array)
    })
}

const KEYS: [&str; 16] = [
    "model_type",
    "hidden_size",
    "n_embd",
    "num_hidden_layers",
    "n_layer",
    "num_attention_heads",
    "n_head",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "n_inner",
    "vocab_size",
    "tie_word_embeddings",
    "image_size",
    "patch_size",
    "max_position_embeddings",
];

proptest! {
    #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn parse_never_panics_on_strings(s in ".{0,200}") {
        let _ = parse_hf_config(&s);
    }

    #[test]
    fn parse_never_panics_on_objects(fields in prop::collection::vec((0usize..KEYS.len(), json_value()), 0..16)) {
        let mut m = serde_json::Map::new();
        for (k, v) in fields {
            m.insert(KEYS[k].to_string(), v);
        }
        let _ = parse_hf_config(&Value::Object(m).to_string());
    }

    #[test]
    fn estimate_never_panics(p in 0usize..Preset::ALL.len(), batch in any::<u64>(), seq in any::<u64>(), small in any::<bool>(), r in 0usize..6, o in 0usize..4, eager in any::<bool>(), gc in any::<bool>()) {
        let preset = Preset::ALL[p];
        let arch = preset.architecture().expect("preset parses");
        let (batch, seq) = if small { (batch % 64, seq % 8192) } else { (batch, seq) };
        let step = TrainingStep {
            batch,
            seq_len: if arch.is_vision() && small { 224 } else { seq },
            precision: PrecisionRecipe::ALL[r],
            optimizer: Optimizer::ALL[o],
            optimizer_impl: OptimizerImpl::ALL[o % 3],
            attention: if eager { AttentionKernel::Eager } else { AttentionKernel::Sdpa },
            checkpointing: if gc { Checkpointing::Full } else { Checkpointing::None },
            compile: estimator_core::Compile::Off,
            loss: estimator_core::LossKind::Hf,
            packing: false,
            padding: false,
            optimizer_in_backward: false,
            activation_offload: false,
            micro_batches: 1,
            kernels: estimator_core::Kernels::Torch,
        };
        if let Ok(e) = estimate_peak(&arch, &step) {
            prop_assert!(e.peak_bytes >= e.at_peak.parameters);
            prop_assert_eq!(e.at_peak.total(), Some(e.peak_bytes));
        }
    }
}

/// One row of `rl-measured.jsonl` (`validation/rl.py`): its objective, phases and peak,
/// estimated.
struct RlRow {
    name: String,
    measured: u64,
    estimated: u64,
    /// (measured, estimated) per phase: generation, scoring, training.
    phases: [(Option<u64>, Option<u64>); 3],
    measured_phase: String,
    estimated_phase: &'static str,
}

fn rl_rows() -> Vec<RlRow> {
    use estimator_core::{
        estimate_objective, Generator, Mesh, Objective, ObjectiveKind, Reference,
    };
    let text = std::fs::read_to_string(format!("{FIXTURES}/rl-measured.jsonl")).expect("rows");
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let v: Value = serde_json::from_str(line).expect("valid JSON line");
        let c = &v["config"];
        let model = c["model"].as_str().expect("model");
        // rl.py names Llama 3.2 1B's config (configs/llama-1b.json) by its Hub name
        let config = if model == "llama-3.2-1b" {
            "llama-1b"
        } else {
            model
        };
        let arch = architecture(config).unwrap_or_else(|| panic!("no architecture for {model}"));
        let precision = match c["precision"].as_str().expect("precision") {
            "amp_bf16" => PrecisionRecipe::AmpBf16,
            "bf16" => PrecisionRecipe::Bf16,
            p => panic!("unknown precision {p}"),
        };
        let kind = ObjectiveKind::from_key(c["objective"].as_str().expect("objective"))
            .expect("objective");
        let peft = c["lora"].as_object().map(|l| {
            let targets = match l["targets"].as_str().expect("targets") {
                "default" => "q_proj,v_proj",
                t => t,
            };
            Peft {
                method: Method::Lora,
                rank: l["r"].as_u64().expect("r"),
                dropout: true,
                targets: arch.lora_targets(targets).expect("targets"),
                adapter_fp32: l["adapter_dtype"].as_str() == Some("float32"),
                quant: Quant4::Nf4,
                double_quant: false,
                kbit_prepare: false,
                // rl.py loads the base in bf16, or in fp32 for amp_bf16 (the recipe's own)
                base_fp32: false,
            }
        });
        let generations = c["generations"].as_u64().unwrap_or(1);
        let objective = Objective {
            kind,
            reference: Reference::from_key(c["reference"].as_str().expect("reference"))
                .expect("reference"),
            max_prompt: c["max_prompt"].as_u64().expect("max_prompt"),
            max_completion: c["max_completion"].as_u64().expect("max_completion"),
            generations,
            generator: c["generator"].as_str().map_or(Generator::Model, |g| {
                Generator::from_key(g).expect("generator")
            }),
            vllm_memory_permille: 300,
            steps_per_generation: c["steps_per_generation"].as_u64().unwrap_or(1),
            iterations: c["num_iterations"].as_u64().unwrap_or(1),
        };
        let batch = match kind {
            ObjectiveKind::Grpo => c["prompts"].as_u64().expect("prompts"),
            _ => c["batch"].as_u64().expect("batch"),
        };
        let step = TrainingStep {
            batch,
            seq_len: objective.seq_len(),
            precision,
            optimizer: Optimizer::AdamW,
            optimizer_impl: optimizer_impl(c["opt_impl"].as_str().unwrap_or("fused")),
            attention: AttentionKernel::Sdpa,
            checkpointing: if c["gc"].as_bool() == Some(true) {
                Checkpointing::Full
            } else {
                Checkpointing::None
            },
            compile: estimator_core::Compile::Off,
            loss: estimator_core::LossKind::TrlFused,
            packing: false,
            padding: false,
            optimizer_in_backward: false,
            activation_offload: false,
            micro_batches: 1,
            kernels: estimator_core::Kernels::Torch,
        };
        let est = estimate_objective(&arch, &step, peft.as_ref(), &Mesh::SINGLE, &objective, None)
            .unwrap_or_else(|e| panic!("{model}: {e}"));
        assert!(est.objective.is_some(), "an objective's phases");
        // each phase's peak: generation and scoring as they are, training its moments' largest
        let phase = |wanted: &[estimator_core::Phase]| {
            est.phase_peaks
                .iter()
                .filter(|(p, _)| wanted.contains(p))
                .filter_map(|(_, c)| c.total())
                .max()
        };
        use estimator_core::Phase as P;
        let step_phase = match est.peak_phase {
            P::Generation => "generation",
            P::Scoring => "scoring",
            _ => "training",
        };
        let measured = |k: &str| v["phases"][k].as_u64();
        out.push(RlRow {
            name: format!(
                "{model} {} ref={} {} gc={} {}b{batch} P{} C{}{}{}",
                kind.key(),
                objective.reference.key(),
                precision.key(),
                step.checkpointing != Checkpointing::None,
                if peft.is_some() { "lora " } else { "" },
                objective.max_prompt,
                objective.max_completion,
                if kind == ObjectiveKind::Grpo {
                    format!(
                        " G{generations} {} spg{} it{}",
                        objective.generator.key(),
                        objective.steps_per_generation,
                        objective.iterations
                    )
                } else {
                    String::new()
                },
                if c["beta"].as_f64().unwrap_or(0.0) > 0.0 && kind == ObjectiveKind::Grpo {
                    " beta>0"
                } else {
                    ""
                },
            ),
            measured: v["peak_bytes"].as_u64().expect("peak_bytes"),
            estimated: est.peak_bytes,
            phases: [
                (measured("generation"), phase(&[P::Generation])),
                (measured("scoring"), phase(&[P::Scoring])),
                (
                    measured("training"),
                    phase(&[P::Forward, P::Backward, P::OptimizerStep]),
                ),
            ],
            measured_phase: v["peak_phase_rl"].as_str().unwrap_or("?").to_owned(),
            estimated_phase: step_phase,
        });
    }
    out
}

/// DPO and GRPO (TRL 1.16.0) per phase: the step's peak within 3%, every phase that runs
/// estimated (and none that does not), the phase that sets the peak named.
#[test]
fn dpo_and_grpo_steps_are_within_three_percent() {
    let rows = rl_rows();
    assert!(rows.len() >= 16, "rl rows missing");
    let pct = |e: u64, m: u64| (e as f64 - m as f64) / m as f64 * 100.0;
    println!("\nrl-measured.jsonl");
    println!("| configuration | measured | estimated | error | generation | scoring | training | peak phase (measured/estimated) |");
    println!("|---|---:|---:|---:|---:|---:|---:|---|");
    let mut failing = Vec::new();
    let mut worst: f64 = 0.0;
    for r in &rows {
        let e = pct(r.estimated, r.measured);
        worst = worst.max(e.abs());
        let cells: Vec<String> = r
            .phases
            .iter()
            .map(|p| match *p {
                (Some(m), Some(e)) => format!("{:+.2}%", pct(e, m)),
                (None, None) => "—".to_owned(),
                (m, e) => {
                    failing.push(format!("{}: phase measured {m:?}, estimated {e:?}", r.name));
                    "missing".to_owned()
                }
            })
            .collect();
        println!(
            "| {} | {} | {} | {e:+.2}% | {} | {} | {} | {}/{} |",
            r.name,
            r.measured,
            r.estimated,
            cells[0],
            cells[1],
            cells[2],
            r.measured_phase,
            r.estimated_phase
        );
        if e.abs() > 3.0 {
            failing.push(format!("{}: {e:+.2}%", r.name));
        }
    }
    println!("max |error| {worst:.2}% over {} rows", rows.len());
    assert!(failing.is_empty(), "{failing:#?}");
}

/// One vision-language row: its measured and estimated peaks and parameter counts.
#[cfg(feature = "vision")]
struct VlmRow {
    name: String,
    measured: u64,
    estimated: u64,
    measured_phase: String,
    estimated_phase: &'static str,
    measured_saved: u64,
    estimated_saved: u64,
    /// Per phase (fwd, bwd, opt): measured, estimated.
    phases: [(u64, u64); 3],
}

#[cfg(feature = "vision")]
fn vlm_rows() -> Vec<VlmRow> {
    use estimator_core::{estimate_vlm, image_tokens, VisionInputs};
    let text = std::fs::read_to_string(format!("{FIXTURES}/vlm-measured.jsonl"))
        .expect("vlm-measured.jsonl");
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let v: Value = serde_json::from_str(line).expect("valid JSON line");
        let c = &v["config"];
        let model = c["model"].as_str().expect("model");
        let path = format!(
            "{}/../validation/configs/{model}.json",
            env!("CARGO_MANIFEST_DIR")
        );
        let config = std::fs::read_to_string(&path).expect("the row's config");
        let arch = parse_hf_config(&config).unwrap_or_else(|e| panic!("{model}: {e}"));
        let precision = PrecisionRecipe::from_key(
            &c["precision"]
                .as_str()
                .expect("precision")
                .replace('_', "-"),
        )
        .expect("precision");
        let lora = c["lm"].as_str() == Some("lora");
        let peft = lora.then(|| Peft {
            method: Method::Lora,
            rank: c["lora_r"].as_u64().expect("lora_r"),
            dropout: false,
            // every linear of the language model's layers
            targets: arch.lora_targets("all-linear").expect("targets"),
            adapter_fp32: true,
            quant: Quant4::Nf4,
            double_quant: false,
            kbit_prepare: false,
            base_fp32: false,
        });
        let size = &c["image_size"];
        let images = VisionInputs {
            images: c["images"].as_u64().expect("images"),
            width: size[0].as_u64().expect("width"),
            height: size[1].as_u64().expect("height"),
            tower_trained: c["vision"].as_str() == Some("trained"),
            projector_trained: c["projector"].as_str() == Some("trained"),
        };
        let text_tokens = c["text_tokens"].as_u64().expect("text_tokens");
        let tokens = image_tokens(&arch, text_tokens, &images).expect("image tokens");
        assert_eq!(
            tokens.image_tokens,
            v["image_tokens"].as_u64().expect("image_tokens"),
            "{model}: image tokens"
        );
        assert_eq!(
            tokens.sequence,
            c["seq"].as_u64().expect("seq"),
            "{model}: sequence"
        );
        let gc = c["gc"].as_bool() == Some(true);
        let step = TrainingStep {
            batch: c["batch"].as_u64().expect("batch"),
            seq_len: text_tokens,
            precision,
            optimizer: Optimizer::AdamW,
            optimizer_impl: optimizer_impl(c["opt_impl"].as_str().unwrap_or("foreach")),
            attention: AttentionKernel::Sdpa,
            checkpointing: if gc {
                Checkpointing::Full
            } else {
                Checkpointing::None
            },
            compile: estimator_core::Compile::Off,
            loss: estimator_core::LossKind::Hf,
            packing: false,
            padding: false,
            optimizer_in_backward: false,
            activation_offload: false,
            micro_batches: 1,
            kernels: estimator_core::Kernels::Torch,
        };
        let est = estimate_vlm(&arch, &step, peft.as_ref(), &images)
            .unwrap_or_else(|e| panic!("{model}: {e}"));
        assert_eq!(
            est.n_params,
            v["n_params"].as_u64().expect("n_params"),
            "{model}: parameters"
        );
        assert_eq!(
            est.trainable_params,
            v["trainable_params"].as_u64().expect("trainable_params"),
            "{model}: trainable parameters"
        );
        let phase = |p: estimator_core::Phase| {
            est.phase_peaks
                .iter()
                .find(|(q, _)| *q == p)
                .and_then(|(_, c)| c.total())
                .unwrap_or(0)
        };
        let measured_phase = |k: &str| v["phase_peak_bytes"][k].as_u64().unwrap_or(0);
        out.push(VlmRow {
            name: format!(
                "{model} b{} {}x{}x{} text{} {} vision={} projector={}{}{}",
                step.batch,
                images.images,
                images.width,
                images.height,
                text_tokens,
                precision.key(),
                c["vision"].as_str().unwrap_or("?"),
                c["projector"].as_str().unwrap_or("?"),
                if gc { " gc" } else { "" },
                peft.map_or(String::new(), |f| format!(" lora r{}", f.rank)),
            ),
            measured: v["peak_bytes"].as_u64().expect("peak_bytes"),
            estimated: est.peak_bytes,
            measured_phase: v["peak_phase"].as_str().unwrap_or("?").to_owned(),
            estimated_phase: est.peak_phase.key(),
            measured_saved: v["saved_act_bytes"].as_u64().unwrap_or(0),
            estimated_saved: est.saved_activation_bytes,
            phases: [
                (measured_phase("fwd"), phase(estimator_core::Phase::Forward)),
                (
                    measured_phase("bwd"),
                    phase(estimator_core::Phase::Backward),
                ),
                (
                    measured_phase("opt"),
                    phase(estimator_core::Phase::OptimizerStep),
                ),
            ],
        });
    }
    out
}

/// Vision-language models (`validation/VLM.md`): every row's peak within 3%, its image
/// tokens, sequence and parameter counts exact.
#[cfg(feature = "vision")]
#[test]
fn vision_language_steps_are_within_three_percent() {
    let rows = vlm_rows();
    assert!(rows.len() >= 16, "vlm rows missing");
    let pct = |e: u64, m: u64| (e as f64 - m as f64) / m.max(1) as f64 * 100.0;
    println!("\nvlm-measured.jsonl");
    println!("| configuration | measured | estimated | error | phase (measured/estimated) | saved activations error | fwd | bwd | opt |");
    println!("|---|---:|---:|---:|---|---:|---:|---:|---:|");
    let mut failing = Vec::new();
    let mut worst: f64 = 0.0;
    for r in &rows {
        let e = pct(r.estimated, r.measured);
        worst = worst.max(e.abs());
        println!(
            "| {} | {} | {} | {e:+.2}% | {}/{} | {:+.2}% | {:+.2}% | {:+.2}% | {:+.2}% |",
            r.name,
            r.measured,
            r.estimated,
            r.measured_phase,
            r.estimated_phase,
            pct(r.estimated_saved, r.measured_saved),
            pct(r.phases[0].1, r.phases[0].0),
            pct(r.phases[1].1, r.phases[1].0),
            pct(r.phases[2].1, r.phases[2].0),
        );
        if e.abs() > 3.0 {
            failing.push(format!("{}: {e:+.2}%", r.name));
        }
    }
    println!("max |error| {worst:.2}% over {} rows", rows.len());
    assert!(failing.is_empty(), "beyond 3%: {failing:#?}");
}

/// One row of a published context-length table.
struct PublishedContext {
    /// The preset.
    model: &'static str,
    /// "GPU VRAM" in GB.
    gb: u64,
    /// The card, where the source names it (our GPU key).
    card: Option<&'static str>,
    /// Unsloth's context length.
    unsloth: u64,
    /// HF + FA2's, `None` for "OOM".
    hf: Option<u64>,
}

/// Unsloth's published context lengths (README at tag February-2026, lines 380-407, and
/// https://unsloth.ai/blog/llama3-3): Llama 3.1 8B and Llama 3.3 70B Instruct, 4-bit QLoRA on
/// the 7 linears, rank 32, batch 1, sequences padded to the length. Each source read as it
/// is written: the 70B's 80 GB row names its card, an A100 80GB (our `a100-80`, 81,920 MiB);
/// the other rows give only "GPU VRAM" in GB, read as 10^9 bytes (a custom card). They
/// measured Unsloth 2024.12 (`validation/UNSLOTH.md` sections 8-9). `None`: "OOM" in the
/// HF + FA2 column.
const UNSLOTH_PUBLISHED: [PublishedContext; 9] = [
    PublishedContext {
        model: "llama3.1-8b",
        gb: 8,
        card: None,
        unsloth: 2_972,
        hf: None,
    },
    PublishedContext {
        model: "llama3.1-8b",
        gb: 12,
        card: None,
        unsloth: 21_848,
        hf: Some(932),
    },
    PublishedContext {
        model: "llama3.1-8b",
        gb: 16,
        card: None,
        unsloth: 40_724,
        hf: Some(2_551),
    },
    PublishedContext {
        model: "llama3.1-8b",
        gb: 24,
        card: None,
        unsloth: 78_475,
        hf: Some(5_789),
    },
    PublishedContext {
        model: "llama3.1-8b",
        gb: 40,
        card: None,
        unsloth: 153_977,
        hf: Some(12_264),
    },
    PublishedContext {
        model: "llama3.1-8b",
        gb: 48,
        card: None,
        unsloth: 191_728,
        hf: Some(15_502),
    },
    PublishedContext {
        model: "llama3.1-8b",
        gb: 80,
        card: None,
        unsloth: 342_733,
        hf: Some(28_454),
    },
    PublishedContext {
        model: "llama3.3-70b",
        gb: 48,
        card: None,
        unsloth: 12_106,
        hf: None,
    },
    PublishedContext {
        model: "llama3.3-70b",
        gb: 80,
        card: Some("a100-80"),
        unsloth: 89_389,
        hf: Some(6_916),
    },
];

/// The longest sequence the page says fits (its verdict: the replayed reserve, the CUDA
/// context and the 5% margin) for `query` with `trainer`'s defaults at rank 32.
fn longest_published(query: &str, trainer: Option<estimator_core::Trainer>) -> Option<u64> {
    let mut state = estimator_core::decode_query(query).state;
    if let Some(t) = trainer {
        t.apply(&mut state);
    }
    "32".clone_into(&mut state.training.lora_rank);
    estimator_core::Scenario::parse(&state)
        .ok()?
        .longest_sequence()?
        .tokens
}

/// Our longest sequence against Unsloth's published one within 10% on at least two thirds
/// of the rows (the issue's bar), and on every row but two, where the step's constants
/// leave nothing: the 8 GB row (the published 8B column is exactly linear: its 8 GB point
/// looks extrapolated) and the 70B on an unnamed 48 GB card, below the 1.34 GB floor of
/// its 80 per-layer RoPE caches and Cut Cross-Entropy's 2.1 GB head gradient (section 9).
/// The HF + FA2 column through transformers and peft is printed beside it.
#[test]
fn unsloth_published_contexts_are_within_ten_percent() {
    use estimator_core::Trainer;
    println!("\n| model | GPU | published | ours (Unsloth 2024.12) | error | ours (2026.3) | HF + FA2 published | ours (HF + FA2) | error |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut within = 0;
    for row in UNSLOTH_PUBLISHED {
        let PublishedContext {
            model,
            gb,
            card: named,
            unsloth: published,
            hf: hf_published,
        } = row;
        // (a custom card's capacity in MiB, rounded down)
        let gpu = named.map_or_else(
            || format!("custom&cap={}", gb * 1_000_000_000 / (1 << 20)),
            str::to_owned,
        );
        let card = format!("m=arch&model={model}&b=1&s=2048&gpu={gpu}");
        let ours = longest_published(&card, Some(Trainer::Unsloth2024)).unwrap_or(0);
        let today = longest_published(&card, Some(Trainer::Unsloth)).unwrap_or(0);
        // transformers + peft with flash attention 2 and checkpointing, the head and loss
        // as transformers computes them, the base prepared for k-bit training
        let hf = longest_published(
            &format!("{card}&method=qlora&r=bf16&o=adamw8bit&attn=flash2&gc=full"),
            None,
        );
        let err = |a: u64, b: u64| (a as f64 - b as f64) / b as f64 * 100.0;
        let e = err(ours, published);
        if e.abs() <= 10.0 {
            within += 1;
        }
        let (hf_text, hf_err) = match (hf, hf_published) {
            (Some(h), Some(p)) => (format!("{h}"), format!("{:+.1}%", err(h, p))),
            (h, _) => (format!("{h:?}"), "-".to_owned()),
        };
        println!(
            "| {model} | {gb} GB | {published} | {ours} | {e:+.1}% | {today} | {} | {hf_text} | {hf_err} |",
            hf_published.map_or("OOM".to_owned(), |p| p.to_string())
        );
        if gb >= 12 && (gb, model) != (48, "llama3.3-70b") {
            assert!(
                e.abs() <= 10.0,
                "{model} on {gb} GB: {ours} against {published}"
            );
        }
        // today's release fits longer: no N x inner LoRA temporary, one RoPE cache
        assert!(
            today > ours,
            "{model} on {gb} GB: 2026.3 {today}, 2024.12 {ours}"
        );
    }
    println!("within 10%: {within} of {}", UNSLOTH_PUBLISHED.len());
    assert!(
        within * 3 >= UNSLOTH_PUBLISHED.len() * 2,
        "{within} rows within 10%"
    );
}

/// Unsloth 2024.12.4's own PyTorch code measured under the harness (its Triton kernels and
/// bitsandbytes' CUDA functions replaced by stand-ins that allocate what their wrappers do:
/// `validation/unsloth/`, `validation/UNSLOTH.md` section 11), against the page's estimate
/// with the same settings, each within 3%.
#[test]
fn unsloth_s_pytorch_code_under_the_harness_is_within_three_percent() {
    let text = std::fs::read_to_string(format!("{FIXTURES}/unsloth-measured.jsonl")).unwrap();
    let mut worst: f64 = 0.0;
    let mut rows = 0;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let row: Value = serde_json::from_str(line).unwrap();
        let c = &row["config"];
        let model = c["model"].as_str().unwrap();
        let mut config: Value = serde_json::from_str(
            &std::fs::read_to_string(format!("{FIXTURES}/configs/{model}.json")).unwrap(),
        )
        .unwrap();
        config["num_hidden_layers"] = c["layers"].clone();
        let gc = if c["gc"] == "offload" {
            "offload"
        } else {
            "none"
        };
        let query = format!(
            "m=arch&gpu=none&kern={}&method={}&lr={}&la={}&ld=0&lt=all-linear&ldt=fp32\
             &q=nf4&dq=on&kbit=off&gc={gc}&attn=sdpa&r=bf16&o=adamw&oi=foreach&loss=hf&b={}&s={}",
            c["kernels"].as_str().unwrap(),
            c["method"].as_str().unwrap(),
            c["lora_r"],
            c["lora_alpha"],
            c["batch"],
            c["seq"],
        );
        let mut state = estimator_core::decode_query(&query).state;
        state.model.preset = None;
        state.model.config_json = config.to_string();
        let e = estimator_core::evaluate(&state).expect("an estimate");
        let measured = row["peak_bytes"].as_u64().unwrap();
        let error = (e.step.peak_bytes as f64 - measured as f64) / measured as f64 * 100.0;
        println!(
            "{model} L{} b{} s{} {} gc {gc}: measured {measured}, estimated {}, {error:+.2}%",
            c["layers"],
            c["batch"],
            c["seq"],
            c["method"].as_str().unwrap(),
            e.step.peak_bytes
        );
        assert_eq!(
            e.step.host_bytes,
            row["offloaded_end_fwd_bytes"].as_u64().unwrap(),
            "{query}: the offloaded layer inputs"
        );
        worst = worst.max(error.abs());
        rows += 1;
    }
    assert_eq!(rows, 13);
    assert!(worst <= 3.0, "largest error {worst:.2}%");
}
