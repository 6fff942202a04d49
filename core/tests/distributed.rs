//! Per-GPU peaks against PyTorch's distributed code run rank by rank on a fake process group
//! (`validation/distributed.py`, `tests/fixtures/distributed-measured.jsonl`): FSDP2, tensor
//! parallelism with and without sequence and loss parallelism, and their combinations.

use estimator_core::{decode_query, evaluate, Field};
use serde_json::Value;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");

/// The page query of a measured row: the harness writes the world size as `n` and 0/1 for
/// the switches; the page takes the data-parallel GPUs and on/off.
fn page_query(row: &Value) -> String {
    let query = row["query"].as_str().expect("query");
    let mut world = 1;
    let mut groups = 1;
    let mut parts = Vec::new();
    for part in query.split('&') {
        let (key, value) = part.split_once('=').unwrap_or((part, ""));
        match key {
            "n" => world = value.parse::<u64>().expect("n"),
            "tp" | "cp" | "pp" => {
                groups *= value.parse::<u64>().expect("group");
                parts.push(part.to_owned());
            }
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
    assert_eq!(world % groups, 0, "{query}: world size over tp x cp x pp");
    parts.push(format!("n={}", world / groups));
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
    s
}

#[test]
fn every_measured_rank_is_within_three_percent() {
    let Ok(text) = std::fs::read_to_string(format!("{FIXTURES}/distributed-measured.jsonl")) else {
        panic!("distributed-measured.jsonl missing");
    };
    println!("| configuration (page query) | measured | estimated | error | phase (measured/estimated) |");
    println!("|---|---:|---:|---:|---|");
    let mut by_strategy: Vec<(String, Vec<f64>)> = Vec::new();
    let mut failures = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let row: Value = serde_json::from_str(line).expect("JSON line");
        let measured = row["peak_bytes"].as_u64().expect("peak_bytes");
        let (query, estimated, phase) = estimate(&row);
        let error = (estimated as f64 - measured as f64) / measured as f64 * 100.0;
        println!(
            "| {query} | {measured} | {estimated} | {error:+.2}% | {}/{phase} |",
            row["peak_phase"].as_str().unwrap_or("?")
        );
        let s = strategy(&query);
        match by_strategy.iter_mut().find(|(k, _)| *k == s) {
            Some((_, v)) => v.push(error.abs()),
            None => by_strategy.push((s, vec![error.abs()])),
        }
        if error.abs() > 3.0 {
            failures.push(format!("{query}: {error:+.2}%"));
        }
    }
    println!("\n| strategy | rows | max abs error | mean abs error |");
    println!("|---|---:|---:|---:|");
    for (s, errors) in &by_strategy {
        let max = errors.iter().copied().fold(0.0, f64::max);
        let mean = errors.iter().sum::<f64>() / errors.len() as f64;
        println!("| {s} | {} | {max:.2}% | {mean:.2}% |", errors.len());
    }
    assert!(failures.is_empty(), "over 3%: {failures:#?}");
}
