//! Fuzz target `hub`: see `src/checks.rs` for what it asserts.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| estimator_core_fuzz::check_hub_id(data));
