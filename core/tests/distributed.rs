//! Per-GPU peaks against PyTorch's distributed code run rank by rank on a fake process group
//! (`validation/distributed.py`, `tests/fixtures/distributed-measured.jsonl`): FSDP2, tensor
//! parallelism with and without sequence and loss parallelism, and their combinations.

use estimator_core::{decode_query, evaluate, Field};
use serde_json::Value;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");

/// The page query of a measured row: the harness writes the world size as `n` (the page's
/// `gpus`) and 0/1 for the switches (the page's on/off).
fn page_query(row: &Value) -> String {
    let query = row["query"].as_str().expect("query");
    let mut parts = Vec::new();
    for part in query.split('&') {
        let (key, value) = part.split_once('=').unwrap_or((part, ""));
        match key {
            "n" => parts.push(format!("gpus={value}")),
            "sp" | "lp" | "raf" => parts.push(format!(
                "{key}={}",
                if value == "1" || value == "on" {
                    "on"
                } else {
                    "off"
                }
            )),
            "off" if value == "none" => {}
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

#[test]
fn every_measured_rank_is_within_three_percent() {
    let compared: Vec<Compared> = rows("distributed-measured.jsonl")
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
    assert!(compared.len() >= 24);
    let failures = report(&compared);
    assert!(failures.is_empty(), "over 3%: {failures:#?}");
}

/// `validation/pipeline.py` measured every stage of each pipeline (`torch.distributed.pipelining`
/// schedules on a fake process group); the page shows the busiest, which must be the
/// measured busiest within 3%.
#[test]
fn every_measured_pipeline_busiest_stage_is_within_three_percent() {
    let mut compared: Vec<Compared> = Vec::new();
    for row in rows("pipeline-measured.jsonl") {
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
    assert!(compared.len() >= 8);
    let failures = report(&compared);
    assert!(failures.is_empty(), "over 3%: {failures:#?}");
}
