//! Per-GPU peaks against PyTorch's distributed code run rank by rank on a fake process group
//! (`validation/distributed.py`, `tests/fixtures/distributed-measured.jsonl`): FSDP2, tensor
//! parallelism with and without sequence and loss parallelism, and their combinations.

use estimator_core::{decode_query, evaluate, Field};
use serde_json::Value;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");

/// The page query of a measured row: the harness writes the world size as `n` (the page's
/// `gpus`), 0/1 for the switches (the page's on/off) and the interleaved schedule as
/// `interleaved1f1b` with its chunks per rank.
fn page_query(row: &Value) -> String {
    let query = row["query"].as_str().expect("query");
    let mut parts = Vec::new();
    for part in query.split('&') {
        let (key, value) = part.split_once('=').unwrap_or((part, ""));
        match key {
            "n" => parts.push(format!("gpus={value}")),
            "sp" | "lp" | "raf" | "uop" | "f8ag" => parts.push(format!(
                "{key}={}",
                if value == "1" || value == "on" {
                    "on"
                } else {
                    "off"
                }
            )),
            "off" if value == "none" => {}
            // (`+` is a space in a query)
            "off" => parts.push(format!("off={}", value.replace('+', "%2B"))),
            // the harness's schedule name, and its chunks per rank (the page's are 2)
            "pps" if value == "interleaved1f1b" => parts.push("pps=interleaved".to_owned()),
            "ppv" => assert_eq!(value, "2", "{query}"),
            _ => parts.push(part.to_owned()),
        }
    }
    parts.join("&")
}

#[track_caller]
fn estimate(row: &Value) -> (String, u64, String) {
    let query = page_query(row);
    let decoded = decode_query(&query);
    assert!(decoded.notices.is_empty(), "{query}: {:?}", decoded.notices);
    let mut state = decoded.state;
    if let Some(file) = row["config_file"].as_str() {
        let text = std::fs::read_to_string(format!("{FIXTURES}/configs/{file}")).expect("config");
        state.set(Field::Config, &text).expect("config field");
    }
    let e = evaluate(&state).unwrap_or_else(|e| panic!("{query}: {e:?}"));
    let phase = e.step.peak_phase.map_or("?", |p| p.key()).to_owned();
    (query, e.step.peak_bytes, phase)
}

/// The strategy a row measures, for the table.
fn strategy(query: &str) -> String {
    let get = |key: &str| {
        query
            .split('&')
            .find_map(|p| p.strip_prefix(&format!("{key}=")))
            .unwrap_or("")
            .to_owned()
    };
    let mut s = get("shard");
    if get("shard") == "fsdp2" && get("raf") == "off" {
        s += " (no reshard)";
    }
    if !get("f8").is_empty() {
        s += &format!(" float8 {}", get("f8"));
        if get("f8ag") == "on" {
            s += " + all-gather";
        }
    }
    if get("shard") == "fsdp1" {
        s += &format!(" {} wrap {} prefetch {}", get("f1s"), get("f1w"), get("bp"));
        if get("off") == "optimizer+params" {
            s += " offload";
        }
    }
    let tp = get("tp");
    if !tp.is_empty() && tp != "1" {
        s += " x tp";
        if get("sp") == "on" {
            s += "+sp";
        }
        if get("lp") == "on" {
            s += "+lp";
        }
    }
    let cp = get("cp");
    if !cp.is_empty() && cp != "1" {
        s += " x cp";
    }
    let pp = get("pp");
    if !pp.is_empty() && pp != "1" {
        s += &format!(" x pp ({})", get("pps"));
    }
    s
}

/// One measured configuration against the estimate.
struct Compared {
    query: String,
    measured: u64,
    estimated: u64,
    /// Measured / estimated (phase or pipeline stage).
    at: String,
}

/// Prints the rows and the per-strategy table; returns the rows over 3%.
fn report(rows: &[Compared]) -> Vec<String> {
    println!("| configuration (page query) | measured | estimated | error | measured/estimated |");
    println!("|---|---:|---:|---:|---|");
    let mut by_strategy: Vec<(String, Vec<f64>)> = Vec::new();
    let mut failures = Vec::new();
    for r in rows {
        let error = (r.estimated as f64 - r.measured as f64) / r.measured as f64 * 100.0;
        println!(
            "| {} | {} | {} | {error:+.2}% | {} |",
            r.query, r.measured, r.estimated, r.at
        );
        let s = strategy(&r.query);
        match by_strategy.iter_mut().find(|(k, _)| *k == s) {
            Some((_, v)) => v.push(error.abs()),
            None => by_strategy.push((s, vec![error.abs()])),
        }
        if error.abs() > 3.0 {
            failures.push(format!("{}: {error:+.2}%", r.query));
        }
    }
    println!("\n| strategy | rows | max abs error | mean abs error |");
    println!("|---|---:|---:|---:|");
    for (s, errors) in &by_strategy {
        let max = errors.iter().copied().fold(0.0, f64::max);
        let mean = errors.iter().sum::<f64>() / errors.len() as f64;
        println!("| {s} | {} | {max:.2}% | {mean:.2}% |", errors.len());
    }
    failures
}

#[track_caller]
fn rows(file: &str) -> Vec<Value> {
    let Ok(text) = std::fs::read_to_string(format!("{FIXTURES}/{file}")) else {
        panic!("{file} missing");
    };
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect()
}

/// Every row of `file` (at least `at_least` of them) against the estimate of its query,
/// printed as a table; fails on any over 3%.
#[track_caller]
fn assert_rows_within_three_percent(file: &str, at_least: usize) {
    let compared: Vec<Compared> = rows(file)
        .iter()
        .map(|row| {
            let (query, estimated, phase) = estimate(row);
            Compared {
                query,
                measured: row["peak_bytes"].as_u64().expect("peak_bytes"),
                estimated,
                at: format!("{}/{phase}", row["peak_phase"].as_str().unwrap_or("?")),
            }
        })
        .collect();
    assert!(
        compared.len() >= at_least,
        "{file}: {} rows",
        compared.len()
    );
    let failures = report(&compared);
    assert!(failures.is_empty(), "{file} over 3%: {failures:#?}");
}

#[test]
fn every_measured_rank_is_within_three_percent() {
    assert_rows_within_three_percent("distributed-measured.jsonl", 24);
}

/// FSDP1 as accelerate wraps a model (`validation/distributed.py --strategy fsdp1`,
/// `validation/FSDP1.md`): every sharding strategy, both wrap policies, the backward
/// prefetch, `use_orig_params`, `CPUOffload` and mixed precision, per rank.
#[test]
fn every_measured_fsdp1_rank_is_within_three_percent() {
    assert_rows_within_three_percent("fsdp1-measured.jsonl", 12);
}

/// torchao's float8 training (`validation/FLOAT8.md`): tensorwise and rowwise on one GPU
/// and under FSDP2, with and without the float8 all-gather.
#[test]
fn every_measured_float8_step_is_within_three_percent() {
    assert_rows_within_three_percent("float8-measured.jsonl", 12);
}

/// `validation/pipeline.py` measured every stage of each pipeline (`torch.distributed.pipelining`
/// schedules on a fake process group); the page shows the busiest, which must be the
/// measured busiest within 3%.
#[test]
fn every_measured_pipeline_busiest_stage_is_within_three_percent() {
    assert_busiest_stages_within_three_percent("pipeline-measured.jsonl", 8);
}

/// The same with FSDP2 inside every stage (`validation/pipeline.py --dp`, as torchtitan
/// composes them): torch's pipelining keeps each stage's gradients unsharded, in
/// `reduce_dtype`, until its one reduction after the last micro-batch.
#[test]
fn every_measured_fsdp2_pipeline_busiest_stage_is_within_three_percent() {
    assert_busiest_stages_within_three_percent("pipeline-fsdp2-measured.jsonl", 4);
}

#[track_caller]
fn assert_busiest_stages_within_three_percent(file: &str, at_least: usize) {
    let mut compared: Vec<Compared> = Vec::new();
    for row in rows(file) {
        if row["stage"].as_u64() != row["busiest_stage"].as_u64() {
            continue;
        }
        let peaks: Vec<u64> = row["stage_peaks"]
            .as_array()
            .expect("stage_peaks")
            .iter()
            .map(|v| v.as_u64().expect("bytes"))
            .collect();
        let query = page_query(&row);
        let decoded = decode_query(&query);
        assert!(decoded.notices.is_empty(), "{query}: {:?}", decoded.notices);
        let e = evaluate(&decoded.state).unwrap_or_else(|e| panic!("{query}: {e:?}"));
        compared.push(Compared {
            measured: peaks.iter().copied().max().expect("a stage"),
            estimated: e.step.peak_bytes,
            at: format!(
                "stage {}/{}",
                row["busiest_stage"],
                e.step.stage.map_or("?".to_owned(), |s| s.to_string())
            ),
            query,
        });
    }
    assert!(
        compared.len() >= at_least,
        "{file}: {} rows",
        compared.len()
    );
    let failures = report(&compared);
    assert!(failures.is_empty(), "{file}, over 3%: {failures:#?}");
}

/// One step's figures for a page query.
#[track_caller]
fn step(query: &str) -> estimator_core::Evaluation {
    let decoded = decode_query(query);
    assert!(decoded.notices.is_empty(), "{query}: {:?}", decoded.notices);
    evaluate(&decoded.state).unwrap_or_else(|e| panic!("{query}: {e:?}"))
}

/// ZeRO-2 makes its gradient partition whole at its first reduction, once the gradients
/// overflow the bucket (`copy_grads_in_partition`), and holds it to the step: Llama 3 8B
/// over 64 GPUs peaks in backward with the busiest rank's 684,720,128 elements of bf16
/// gradients (the whole tensors its piece touches), none before the bucket overflows.
#[test]
fn zero2_holds_its_whole_partition_from_the_first_reduction() {
    let e = step("m=arch&model=llama3-8b&b=1&s=512&r=mixed-bf16&o=adamw&gc=full&gpu=h100-80&shard=zero2&gpus=64");
    assert_eq!(e.step.peak_phase, Some(estimator_core::Phase::Backward));
    let gradients = e
        .step
        .parts
        .iter()
        .find(|(k, _)| *k == estimator_core::PartKind::Gradients);
    assert_eq!(gradients.map(|&(_, b)| b), Some(2 * 684_720_128));
}

/// DeepSpeed allocates its reduce bucket whole (`torch.empty(reduce_bucket_size)`), however
/// little trains: a LoRA rank holds the 5e8 bf16 elements in backward under ZeRO-2 and
/// from start-up under ZeRO-3, as a rank training every parameter does.
#[test]
fn a_lora_rank_holds_deepspeed_s_whole_reduce_bucket() {
    let base = "m=arch&model=llama3-8b&b=1&s=2048&r=bf16&o=adamw&method=lora&gpus=8&gpu=h100-80";
    for stage in ["zero2", "zero3"] {
        let peak = |rbs: u64| {
            step(&format!("{base}&shard={stage}&rbs={rbs}"))
                .step
                .peak_bytes
        };
        assert_eq!(
            peak(500_000_000) - peak(1),
            2 * (500_000_000 - 1),
            "{stage}"
        );
    }
}

/// DeepSpeed's own `estimate_zero2_model_states_mem_needs` / `estimate_zero3_...`
/// (deepspeed 0.19.8, `validation/deepspeed_check.py` transcribes them) against the
/// per-rank state this estimator derives from DeepSpeed's source
/// (`validation/DEEPSPEED.md`). They differ where DeepSpeed's formulas are known to be off:
/// they count an fp32 gradient partition (4 bytes) that exists only inside the optimizer
/// step (the partition DeepSpeed keeps is bf16: 2 bytes), and ZeRO-3's `4 x largest
/// module` stands for the gathered working set this estimator adds while modules run.
/// Neither counts the 1 GB reduce bucket, which this estimator adds in backward, and
/// ZeRO-2's "2P/N" of bf16 gradients is really the whole tensors the busiest rank's partition
/// touches.
#[test]
fn zero_model_states_against_deepspeed_s_estimate_functions() {
    let base = "m=arch&model=llama3-8b&b=1&s=2048&r=mixed-bf16&o=adamw&gc=full&gpu=h100-80";
    let config = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/configs/llama3-8b.json"
    ))
    .expect("fixture");
    let arch = estimator_core::parse_hf_config(&config).expect("parses");
    for gpus in [8u64, 64] {
        let e1 = step(&format!("{base}&shard=ddp"));
        let p = e1.n_params;
        let part = p.div_ceil(gpus);
        // DeepSpeed: 2P + 18P/N (ZeRO-2, no offload)
        let deepspeed_zero2 = 2 * p + 18 * p / gpus;
        let ours = step(&format!("{base}&shard=zero2&gpus={gpus}"));
        let state = ours.step.model_state_bytes;
        let touched = arch
            .zero_partition_elements(&estimator_core::Mesh::default(), gpus)
            .expect("splits");
        assert!(touched > part, "N={gpus}: {touched} vs {part}");
        let counted_by_deepspeed_only = 4 * part;
        let counted_by_us_only = 2 * (touched - part);
        let off =
            (state + counted_by_deepspeed_only - counted_by_us_only).abs_diff(deepspeed_zero2);
        assert!(
            off < 1 << 20,
            "ZeRO-2 N={gpus}: {state} + 4P/N - 2(touched - P/N) vs {deepspeed_zero2}"
        );
        // the reduce bucket: 5e8 bf16 elements in backward
        assert!(ours.step.peak_bytes > state + 1_000_000_000);
        // ZeRO-2 with the optimizer offloaded: DeepSpeed's 2P on the GPU, exactly
        let offloaded = step(&format!("{base}&shard=zero2&gpus={gpus}&off=optimizer"));
        assert_eq!(offloaded.step.model_state_bytes, 2 * p);
        // host: fp32 master and moments, fp32 gradients, a bf16 staging copy: 18 bytes
        let host = offloaded.step.host_bytes;
        assert!(
            host.abs_diff(18 * part) < 1 << 20,
            "{host} vs {}",
            18 * part
        );
        // ZeRO-3: DeepSpeed's 4 LL + 18P/N, LL the largest module (the embedding here)
        let largest_module = 128_256 * 4096;
        let deepspeed_zero3 = 4 * largest_module + 18 * p / gpus;
        let ours = step(&format!("{base}&shard=zero3&gpus={gpus}"));
        let state = ours.step.model_state_bytes;
        let off = (state + 2 * part + 4 * largest_module).abs_diff(deepspeed_zero3);
        assert!(
            off < 1 << 20,
            "ZeRO-3 N={gpus}: {state} vs {deepspeed_zero3}"
        );
        // both offloaded: DeepSpeed's GPU figure is the working set alone
        let both = step(&format!(
            "{base}&shard=zero3&gpus={gpus}&off=optimizer%2Bparams"
        ));
        assert_eq!(both.step.model_state_bytes, 0);
        assert!(both.step.host_bytes.abs_diff(20 * part) < 1 << 20);
    }
}

/// FSDP2's `CPUOffloadPolicy`: the shards (parameters, gradients, optimizer states) live in
/// host RAM; the GPU keeps what is gathered.
#[test]
fn offloaded_lora_keeps_the_base_s_shards_on_the_host() {
    // Llama 3 8B in bf16 over 8 ranks: about 2 GB of the frozen base per rank
    for engine in ["fsdp2", "fsdp1&f1w=layers", "zero3"] {
        let base = format!(
            "m=arch&model=llama3-8b&b=1&s=2048&r=bf16&o=adamw&gc=full&gpus=8&shard={engine}\
             &method=lora&lr=16"
        );
        let on_gpu = step(&base);
        let offloaded = step(&format!("{base}&off=optimizer%2Bparams"));
        let moved = on_gpu.step.peak_bytes - offloaded.step.peak_bytes;
        assert!(
            (1_800_000_000..2_200_000_000).contains(&moved),
            "{engine}: {moved}"
        );
        assert_eq!(on_gpu.step.host_bytes, 0, "{engine}");
        assert!(offloaded.step.host_bytes >= moved, "{engine}");
        // the optimizer alone (not FSDP1's: its one switch moves both) moves only the
        // adapters' state
        if engine != "fsdp1&f1w=layers" {
            let optimizer = step(&format!("{base}&off=optimizer"));
            assert!(
                optimizer.step.peak_bytes < on_gpu.step.peak_bytes,
                "{engine}"
            );
            assert!(
                optimizer.step.peak_bytes > offloaded.step.peak_bytes,
                "{engine}"
            );
        }
    }
}

#[test]
fn fsdp2_offload_moves_the_shards_to_the_host() {
    let base =
        "m=arch&model=llama3.2-1b&b=2&s=2048&r=mixed-bf16&o=adamw&gc=full&shard=fsdp2&gpus=8";
    let on_gpu = step(base);
    let offloaded = step(&format!("{base}&off=optimizer%2Bparams"));
    assert_eq!(on_gpu.step.host_bytes, 0);
    assert_eq!(offloaded.step.host_bytes, on_gpu.step.model_state_bytes);
    assert_eq!(offloaded.step.model_state_bytes, 0);
    assert!(
        offloaded.step.peak_bytes + on_gpu.step.model_state_bytes / 2 < on_gpu.step.peak_bytes + 1
    );
}

/// Megatron-LM's plan: its vocabulary-parallel cross-entropy keeps the logits split (as
/// loss parallel does, whatever `lp` says) and turns the saved softmax into the gradient in
/// place, so its loss backward holds one 16-bit slice where torch's `loss_parallel` holds
/// three fp32 slices (derived from `megatron/core/tensor_parallel/cross_entropy.py`, not
/// measured).
#[test]
fn megatron_s_loss_is_vocabulary_parallel_and_in_place() {
    let base = "m=arch&model=llama3.2-1b&b=1&s=4096&r=bf16&o=adamw&gc=full&gpus=4&tp=4&sp=on";
    let gathered = step(&format!("{base}&lp=off")).step.peak_bytes;
    let split = step(&format!("{base}&lp=on")).step.peak_bytes;
    let megatron = step(&format!("{base}&lp=off&tpp=megatron")).step.peak_bytes;
    assert_eq!(
        step(&format!("{base}&lp=on&tpp=megatron")).step.peak_bytes,
        megatron
    );
    assert!(
        megatron < split && split < gathered,
        "{megatron} {split} {gathered}"
    );
    // V/tp x tokens fp32 slices: three in torch's backward against none new in Megatron's
    let slice = 4096 * 128_256 / 4 * 4;
    assert!(split - megatron > slice, "{split} - {megatron}");
}

/// FSDP2's `reshard_after_forward` as an int: each layer keeps its share of a smaller group
/// from its forward to its backward, between resharding fully (on) and not at all (off).
#[test]
fn reshard_after_forward_to_a_smaller_group_sits_between_on_and_off() {
    let base = "m=arch&model=llama3.2-1b&b=2&s=2048&r=bf16&o=adamw&gc=full&shard=fsdp2&gpus=8";
    let peak = |raf: &str| step(&format!("{base}&raf={raf}")).step.peak_bytes;
    let (on, four, two, off) = (peak("on"), peak("4"), peak("2"), peak("off"));
    assert!(
        on < four && four < two && two < off,
        "{on} {four} {two} {off}"
    );
    // the layers' bf16 weights, halved against a quarter
    let layers = off - on;
    assert!(
        (two - four).abs_diff(layers / 4) < layers / 50,
        "{two} - {four} vs {layers} / 4"
    );
}

/// DDP on several GPUs: the reducer's buckets are a second copy of the gradients, there from
/// construction (`gradient_as_bucket_view=False`, torch's default).
#[test]
fn ddp_buckets_copy_the_gradients() {
    let base = "m=arch&model=llama3.2-1b&b=2&s=2048&r=bf16&o=adamw&gc=full&shard=ddp";
    let one = step(&format!("{base}&gpus=1")).step;
    let eight = step(&format!("{base}&gpus=8")).step;
    let gradients = 1_235_814_400u64 * 2;
    assert!((eight.model_state_bytes - one.model_state_bytes).abs_diff(gradients) < 1 << 20);
    assert!(eight.peak_bytes >= one.peak_bytes + gradients - (1 << 20));
}

/// Prints `id`'s reserved figure in `e` against the `published_gib` its run logged; a miss
/// beyond `percent` joins `failures`.
fn check_reserved(
    id: &str,
    e: &estimator_core::Evaluation,
    published_gib: f64,
    percent: f64,
    failures: &mut Vec<String>,
) {
    const GIB: f64 = (1u64 << 30) as f64;
    let reserved = e.reserved_bytes() as f64 / GIB;
    let error = (reserved - published_gib) / published_gib * 100.0;
    println!("{id}: published {published_gib:.2} GiB, ours {reserved:.2} GiB ({error:+.1}%)");
    if error.abs() > percent {
        failures.push(format!(
            "{id}: {reserved:.2} GiB against {published_gib:.2} ({error:+.1}%)"
        ));
    }
}

/// torchtitan's logged `max_memory_reserved` for Llama 3 / 3.1 8B under FSDP2 on H100s and
/// H200s (published: `validation/published/multi-gpu.tsv`, where each row's source, quote and
/// reading are), against the reserved figure with FSDP2's all-gather and reduce-scatter
/// buffers replayed on their own streams. Without the streams these rows read 11-25% low
/// (`--allocator expandable`, which torchtitan's launcher sets, left the replay no slack).
#[test]
fn fsdp2_reserved_memory_against_torchtitan_s_published_runs() {
    let common = "m=arch&r=mixed-bf16&o=adamw&oi=foreach&attn=sdpa&alloc=expandable&shard=fsdp2";
    let rows = [
        // torchao's README (pytorch/torchtitan#778): bf16 eager, no checkpointing, every
        // second layer, every layer
        (
            "F8NC-NOAC",
            "model=llama3-8b&s=4096&b=1&gc=none&comp=off&gpus=8&gpu=custom&cap=97280",
            53.12,
        ),
        (
            "F8NC-AC2",
            "model=llama3-8b&s=4096&b=1&gc=every%3A2&comp=off&gpus=8&gpu=custom&cap=97280",
            40.60,
        ),
        (
            "F8NC-FULLAC",
            "model=llama3-8b&s=4096&b=1&gc=full&comp=off&gpus=8&gpu=custom&cap=97280",
            28.07,
        ),
        // torchao's training benchmark (bf16, per-op checkpointing, blocks compiled)
        (
            "AO-H100-BF16",
            "model=llama3-8b&s=8192&b=1&gc=ops&comp=blocks&gpus=8&gpu=custom&cap=97280",
            47.65,
        ),
        // torchtitan's 2024-12 tables 1 and 3 (FSDP, eager, per-op checkpointing)
        (
            "TT24-T3-FSDP",
            "model=llama3.1-8b&s=8192&b=2&gc=ops&comp=off&gpus=128&gpu=custom&cap=97280",
            67.00,
        ),
        (
            "TT24-T1-COMPILE",
            "model=llama3.1-8b&s=8192&b=2&gc=ops&comp=blocks&gpus=8&gpu=custom&cap=97280",
            77.00,
        ),
    ];
    let mut failures = Vec::new();
    for (id, query, published_gib) in rows {
        let e = step(&format!("{common}&{query}"));
        check_reserved(id, &e, published_gib, 5.0, &mut failures);
    }
    assert!(failures.is_empty(), "over 5%: {failures:#?}");
}

/// Answer.AI's FSDP1 + QLoRA runs on two RTX 3090s (`fsdp_qlora` train.py: bitsandbytes nf4
/// with `quant_storage` bf16, every decoder layer a unit, `BACKWARD_PRE`), their logged
/// `max_memory_reserved` (published: `validation/published/multi-gpu.tsv`), against the reserve
/// with FSDP1's flat parameters replayed on their streams, the 4-bit layers gathered in their
/// packed storage. Without the streams these rows read 9.5-12% low. (The short-sequence
/// and batch-4 rows still read 12-25% low: what loading and quantizing the model left
/// reserved is not modelled.)
#[test]
fn fsdp1_qlora_reserved_memory_against_answer_ai_s_published_runs() {
    let common = "m=arch&r=bf16&o=adamw&gc=full&attn=sdpa&loss=hf&method=qlora\
        &lr=64&la=16&ld=0.1&lt=q_proj%2Ck_proj%2Cv_proj%2Cup_proj%2Cdown_proj%2Cgate_proj\
        &ldt=model&q=nf4&dq=on&kbit=off&gpu=rtx3090&gpus=2&shard=fsdp1&f1w=layers&bp=pre&s=2048";
    let rows = [
        ("AA-3090-Q7-2048", "llama2-7b.json", 1, 5.21),
        ("AA-3090-Q7-B10", "llama2-7b.json", 10, 20.97),
        ("AA-3090-QYI34-B2", "yi-34b.json", 2, 23.05),
    ];
    let mut failures = Vec::new();
    for (id, config, batch, published_gib) in rows {
        let query = format!("{common}&b={batch}");
        let decoded = decode_query(&query);
        assert!(decoded.notices.is_empty(), "{query}: {:?}", decoded.notices);
        let mut state = decoded.state;
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../validation/published/configs/"
        );
        let text = std::fs::read_to_string(format!("{path}{config}")).expect("config");
        state.set(Field::Model, "custom").expect("model field");
        state.set(Field::Config, &text).expect("config field");
        let e = evaluate(&state).unwrap_or_else(|e| panic!("{id}: {e:?}"));
        check_reserved(id, &e, published_gib, 7.0, &mut failures);
    }
    assert!(failures.is_empty(), "over 7%: {failures:#?}");
}

/// FSDP2 shards a 4-bit base's quantization state with its data (torchao's `NF4Tensor`
/// chunks its scalers with it: `nf4_split`), where FSDP1's flat parameters leave
/// bitsandbytes' `quant_state`, a module attribute, whole on every rank: on 8 GPUs an FSDP2
/// rank holds an eighth of what an FSDP1 rank holds of it (the state is what QLoRA's buffers
/// hold beyond LoRA's).
#[test]
fn fsdp2_shards_the_4_bit_quantization_state() {
    let base = "m=arch&model=llama3-8b&b=1&s=2048&r=bf16&o=adamw&gc=full&gpus=8";
    let buffers = |query: &str| {
        let e = step(query).step;
        e.parts
            .iter()
            .find(|(k, _)| *k == estimator_core::PartKind::Buffers)
            .map_or(0, |(_, b)| *b)
    };
    let lora = buffers(&format!("{base}&method=lora&shard=fsdp1"));
    let whole = buffers(&format!("{base}&method=qlora&shard=fsdp1")) - lora;
    let sharded = buffers(&format!("{base}&method=qlora&shard=fsdp2")) - lora;
    assert!(whole > 100 << 20, "{whole}");
    assert_eq!(sharded, whole.div_ceil(8));
}

/// A model that a mesh cannot split is refused with the group it does not split over.
#[test]
fn an_unsplittable_model_names_the_group_it_does_not_split_over() {
    let base = "m=arch&model=llama3-8b&b=1&s=2048";
    for (mesh, expected) in [
        (
            "gpus=64&pp=64&shard=ddp",
            "32 layers do not split evenly over 64 pipeline stages",
        ),
        (
            "gpus=3&tp=3&shard=fsdp2",
            "32 attention heads do not split evenly over 3 tensor-parallel GPUs",
        ),
        (
            "gpus=3&cp=3&shard=fsdp2",
            "2048 sequence positions do not split evenly over 3 context-parallel GPUs",
        ),
    ] {
        let query = format!("{base}&{mesh}");
        let decoded = decode_query(&query);
        assert!(decoded.notices.is_empty(), "{query}: {:?}", decoded.notices);
        let error = evaluate(&decoded.state).err().map(|e| e.to_string());
        assert!(
            error.as_deref().is_some_and(|e| e.contains(expected)),
            "{query}: {error:?}"
        );
    }
}
