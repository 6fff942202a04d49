//! Replays every input that once failed a fuzz target, and the fuzz seeds as a smoke test,
//! through the same assertions the targets make (`core/fuzz/src/checks.rs`).
//!
//! Inputs live one per file under `tests/fuzz_regressions/<target>/` (regressions) and
//! `fuzz/seeds/<target>/` (seeds). To keep a new failure forever, copy the minimised
//! artifact (`cargo fuzz tmin`) into `tests/fuzz_regressions/<target>/`.

#[path = "../fuzz/src/checks.rs"]
#[allow(dead_code)]
mod checks;

use std::fs;
use std::path::Path;

/// Runs `check` on every file of `<dir>/<target>/`, naming the file that fails.
fn replay(dir: &str, target: &str, check: fn(&[u8])) -> usize {
    let folder = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir).join(target);
    let Ok(entries) = fs::read_dir(&folder) else {
        return 0;
    };
    let mut paths: Vec<_> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .collect();
    paths.sort();
    for path in &paths {
        let data = fs::read(path).expect("readable input");
        let outcome = std::panic::catch_unwind(|| check(&data));
        assert!(
            outcome.is_ok(),
            "{} fails the `{target}` checks",
            path.display()
        );
    }
    paths.len()
}

#[track_caller]
fn replay_all(target: &str, check: fn(&[u8])) {
    let seeds = replay("fuzz/seeds", target, check);
    replay("tests/fuzz_regressions", target, check);
    assert!(seeds > 0, "no seeds found for `{target}`");
}

#[test]
fn query_inputs() {
    replay_all("query", checks::check_query);
}

#[test]
fn config_inputs() {
    replay_all("config", checks::check_config);
}

#[test]
fn hub_id_inputs() {
    replay_all("hub", checks::check_hub_id);
}

#[test]
fn number_inputs() {
    replay_all("numbers", checks::check_numbers);
}

/// Inputs small enough to keep inline, by target.
#[test]
fn inline_inputs() {
    for input in [&b""[..], b"&&&", b"?", b"%", b"=", b"m=arch&model=custom"] {
        checks::check_query(input);
    }
    for input in [
        &b""[..],
        b"{}",
        b"[1]",
        b"{\"model_type\":\"t5\"}",
        b"\xef\xbb\xbf{\"model_type\":\"gpt2\",\"n_layer\":2,\"n_embd\":64,\"n_head\":2,\"vocab_size\":100,\"n_positions\":64}",
        b"\xef\xbb",
    ] {
        checks::check_config(input);
    }
    for input in [&b""[..], b"-", b"e", b".", b"1e", b"\xff"] {
        checks::check_numbers(input);
    }
    for input in [
        &b""[..],
        b"/",
        b"@",
        b"a/b@",
        b"a/b@a/b",
        b"\xff/\xfe",
        b"a/b@%2F",
    ] {
        checks::check_hub_id(input);
    }
}
