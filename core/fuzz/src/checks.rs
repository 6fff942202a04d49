//! The properties the fuzz targets check, one function per target.
//!
//! Shared by the cargo-fuzz targets (`fuzz_targets/*.rs`) and by the regression test
//! `core/tests/fuzz_regressions.rs`, which includes this file with `#[path]`, so a saved
//! input is replayed against exactly the assertions that once failed on it.
//!
//! Every function takes arbitrary bytes and panics (assert) when a property does not hold.

use estimator_core::{
    decode_query, encode_query, estimate_peak, evaluate, parse_activation_mb, parse_batch,
    parse_hf_config, parse_params, percent_decode, percent_encode, read_config_body,
    AttentionKernel, Checkpointing, ConfigBody, Evaluation, HubError, HubId, MaxBatch, Optimizer,
    PageState, ParamUnit, PartKind, PrecisionRecipe, TrainingStep, BYTES_PER_MB, HUB_ORIGIN,
    MAX_BATCH, MAX_CONFIG_CHARS, MAX_PARAMS,
};

/// Largest activation size per sample the activation field accepts, in bytes: 10^7 MB.
/// (`MAX_ACTIVATION_BYTES_PER_SAMPLE` in `core/src/simple.rs`, not exported.)
const MAX_ACTIVATION_BYTES: u64 = 10_000_000 * BYTES_PER_MB;

/// `query`: a query string (or stored state) from anywhere.
///
/// - `decode_query` and `evaluate` never panic;
/// - the state decoded from the re-encoded state is the same, except `config_json`, which
///   a link carries in compact form (and not at all when a preset is the model); the model
///   it describes is the same, and a second round trip changes nothing at all;
/// - an `Ok` evaluation is consistent (see [`check_evaluation`]).
pub fn check_query(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let decoded = decode_query(&text);
    assert!(decoded.notices.len() <= 9, "{:?}", decoded.notices);

    let encoded = encode_query(&decoded.state);
    let again = decode_query(&encoded);
    assert!(
        again.notices.is_empty(),
        "re-encoded state has notices: {:?}\nlink: {encoded}",
        again.notices
    );
    let without_config = |s: &PageState| {
        let mut page_state = s.clone();
        page_state.model.config_json = String::new();
        page_state
    };
    assert_eq!(
        without_config(&again.state),
        without_config(&decoded.state),
        "round trip changed the state\nlink: {encoded}"
    );
    assert_eq!(
        again.state.architecture(),
        decoded.state.architecture(),
        "round trip changed the model\nlink: {encoded}"
    );
    // After one trip the state is a fixed point: exactly equal, config included.
    let twice = decode_query(&encode_query(&again.state));
    assert_eq!(
        twice.state, again.state,
        "second round trip changed the state"
    );

    let result = evaluate(&decoded.state);
    assert_eq!(
        evaluate(&again.state),
        result,
        "the round-tripped state evaluates differently\nlink: {encoded}"
    );
    if let Ok(evaluation) = result {
        check_evaluation(&evaluation);
    }
}

/// The figures of an `Ok` evaluation agree with each other.
pub fn check_evaluation(e: &Evaluation) {
    // Peak = sum of the parts shown (simple mode by definition; architecture mode: the parts
    // are the categories alive at the peak, KV cache included).
    let sum = e
        .step
        .parts
        .iter()
        .try_fold(0u64, |acc, (_, b)| acc.checked_add(*b));
    assert_eq!(sum, Some(e.step.peak_bytes), "parts {:?}", e.step.parts);
    assert!((1..=MAX_BATCH).contains(&e.batch), "batch {}", e.batch);

    // The sweep: strictly increasing batches, the chosen one exactly once with the same
    // figures, and totals that grow with the batch (the search of the largest batch relies
    // on it: see `max_batch_that_fits`).
    assert!(
        e.sweep.windows(2).all(|w| w[0].batch < w[1].batch),
        "sweep not sorted by batch: {:?}",
        e.sweep.iter().map(|r| r.batch).collect::<Vec<_>>()
    );
    assert!(
        e.sweep
            .windows(2)
            .all(|w| w[0].total_bytes <= w[1].total_bytes),
        "sweep totals shrink as the batch grows: {:?}",
        e.sweep
            .iter()
            .map(|r| (r.batch, r.total_bytes))
            .collect::<Vec<_>>()
    );
    let selected: Vec<_> = e.sweep.iter().filter(|r| r.is_selected).collect();
    assert_eq!(selected.len(), 1, "selected rows: {selected:?}");
    assert_eq!(selected[0].batch, e.batch);
    assert_eq!(selected[0].total_bytes, e.step.peak_bytes);
    assert_eq!(selected[0].peak_phase, e.step.peak_phase);
    // Every column is taken at the peak: the step's parts of that moment.
    let part = |kinds: &[PartKind]| -> u64 {
        e.step
            .parts
            .iter()
            .filter(|(k, _)| kinds.contains(k))
            .map(|(_, b)| *b)
            .sum()
    };
    assert_eq!(
        selected[0].model_state_bytes,
        part(&[
            PartKind::Weights,
            PartKind::Gradients,
            PartKind::OptimizerStates
        ])
    );
    assert_eq!(selected[0].activation_bytes, part(&[PartKind::Activations]));
    for row in &e.sweep {
        assert_eq!(
            row.model_state_bytes + row.activation_bytes + row.other_bytes(),
            row.total_bytes,
            "columns do not add up to the peak: {row:?}"
        );
        assert!(
            (1..=MAX_BATCH).contains(&row.batch),
            "row batch {}",
            row.batch
        );
        assert_eq!(row.fits.is_some(), e.verdict.is_some());
    }

    // Fit: the verdict, the sweep's column and the largest batch that fits agree.
    assert_eq!(e.verdict.is_some(), e.plan.capacity_bytes.is_some());
    assert_eq!(e.max_batch.is_some(), e.plan.capacity_bytes.is_some());
    if let (Some(verdict), Some(row)) = (e.verdict, selected.first()) {
        assert_eq!(row.fits, Some(verdict.fits()));
    }
    match e.max_batch {
        Some(MaxBatch::Fits(max)) => {
            assert!((1..=MAX_BATCH).contains(&max), "max batch {max}");
            for row in &e.sweep {
                assert_eq!(
                    row.fits,
                    Some(row.batch <= max),
                    "largest batch that fits is {max}, but the sweep says {row:?}"
                );
            }
        }
        Some(MaxBatch::NoneFits(verdict)) => {
            assert!(!verdict.fits());
            assert!(
                e.sweep.iter().all(|r| r.fits == Some(false)),
                "none fits, but the sweep says {:?}",
                e.sweep
            );
        }
        None => {}
    }
    if let Some(plan) = e.accumulation {
        if let Some(target) = e.plan.global_batch {
            assert!(
                plan.global_batch() >= target,
                "{plan:?} misses the target {target}"
            );
        }
        assert_eq!(plan.num_gpus, e.plan.num_gpus);
    }
}

/// `config`: a pasted `config.json`.
///
/// - `parse_hf_config` never panics;
/// - an accepted config survives its compact form: `parse(to_config_json(a)) == Ok(a)`;
/// - `estimate_peak` never panics on small steps (batch 1 and 4, short and long sequences,
///   every recipe, optimizer, kernel and checkpointing setting, picked from the input's
///   bytes), and an `Ok` estimate's peak is its largest phase.
pub fn check_config(data: &[u8]) {
    check_config_body(data);
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(arch) = parse_hf_config(text) else {
        return;
    };
    let compact = arch.to_config_json();
    assert_eq!(
        parse_hf_config(&compact),
        Ok(arch.clone()),
        "the compact form {compact} is read differently"
    );

    let longest = if arch.is_vision() {
        arch.image_size()
    } else {
        arch.max_positions().unwrap_or(u64::MAX).min(2048)
    };
    // A cheap mix of the input's bytes picks the settings, so the fuzzer can steer them.
    let pick = data.iter().fold(0usize, |h, &b| {
        h.wrapping_mul(31).wrapping_add(usize::from(b))
    });
    for (k, (batch, seq_len)) in [(1, 1), (1, longest), (4, longest.min(64)), (4, longest)]
        .into_iter()
        .enumerate()
    {
        let seq_len = if arch.is_vision() {
            arch.image_size()
        } else {
            seq_len
        };
        let p = pick.wrapping_add(k.wrapping_mul(7919));
        let step = TrainingStep {
            batch,
            seq_len,
            precision: PrecisionRecipe::ALL[p % PrecisionRecipe::ALL.len()],
            optimizer: Optimizer::ALL[(p / 7) % Optimizer::ALL.len()],
            optimizer_impl: estimator_core::OptimizerImpl::ALL[(p / 11) % 3],
            attention: AttentionKernel::ALL[(p / 31) % AttentionKernel::ALL.len()],
            checkpointing: Checkpointing::ALL[(p / 61) % Checkpointing::ALL.len()],
            compile: estimator_core::Compile::Off,
            loss: estimator_core::LossKind::ALL[(p / 7) % estimator_core::LossKind::ALL.len()],
            packing: p % 5 == 1,
            padding: p % 3 == 1,
            optimizer_in_backward: p % 4 == 1,
            activation_offload: p % 6 == 1,
            micro_batches: 1,
            kernels: estimator_core::Kernels::ALL[(p / 13) % estimator_core::Kernels::ALL.len()],
        };
        #[cfg(feature = "vision")]
        if arch.is_vision_language() {
            // images of the byte-picked size, tower frozen or trained: no panic, and the
            // peak is the largest phase
            let side = [1, 224, 1344, 4000, 32_768][p % 5];
            let images = estimator_core::VisionInputs {
                images: [0, 1, 3][(p / 5) % 3],
                width: side,
                height: [1, 300, 896, 32_768][(p / 13) % 4],
                tower_trained: p % 2 == 0,
                projector_trained: p % 3 != 0,
            };
            if let Ok(e) = estimator_core::estimate_vlm(&arch, &step, None, &images) {
                assert_eq!(e.at_peak.total(), Some(e.peak_bytes), "{step:?} {images:?}");
                assert!(e.n_params >= arch.parameter_count());
            }
        }
        if let Ok(estimate) = estimate_peak(&arch, &step) {
            assert_eq!(estimate.n_params, arch.parameter_count());
            assert_eq!(
                estimate.at_peak.total(),
                Some(estimate.peak_bytes),
                "{step:?}"
            );
            assert!(
                estimate
                    .phase_peaks
                    .iter()
                    .all(|(_, c)| c.total().is_some_and(|t| t <= estimate.peak_bytes)),
                "a phase exceeds the peak: {step:?} {estimate:?}"
            );
            assert!(estimate
                .phase_peaks
                .iter()
                .any(|(phase, _)| *phase == estimate.peak_phase));
        }
    }
}

/// `config`, read as the Hub's answer (the page's and the CLI's `--hub` path):
///
/// - reading the body at once or in pieces (sizes picked from the input) never panics and
///   gives the same outcome;
/// - it is accepted exactly when the bytes are UTF-8 (a byte-order mark dropped) of at most
///   `MAX_CONFIG_CHARS` characters that `parse_hf_config` reads, and then it is that text;
/// - a body past the cap is refused as too large, before its end.
fn check_config_body(data: &[u8]) {
    let whole = read_config_body(data);
    let piece = 1 + usize::from(data.first().copied().unwrap_or(0)) % 64;
    let mut body = ConfigBody::new(None).expect("no announced length");
    let mut pieces = Ok(());
    for chunk in data.chunks(piece) {
        pieces = body.push(chunk);
        if pieces.is_err() {
            break;
        }
    }
    let pieces = pieces.and_then(|()| body.finish());
    assert_eq!(whole, pieces, "in pieces of {piece}");
    let text = std::str::from_utf8(data)
        .ok()
        .map(|t| t.strip_prefix('\u{feff}').unwrap_or(t));
    match (&whole, text) {
        (Ok(read), Some(text)) => {
            assert_eq!(read, text);
            assert!(text.chars().count() <= MAX_CONFIG_CHARS);
            assert!(parse_hf_config(text).is_ok());
        }
        (Ok(_), None) => panic!("bytes that are not UTF-8 were accepted"),
        (Err(HubError::TooLarge), _) => {
            let starts = data.iter().filter(|&&b| b & 0xC0 != 0x80).count();
            assert!(starts > MAX_CONFIG_CHARS, "refused at {starts} characters");
        }
        (Err(HubError::Config(e)), Some(text)) => {
            if text.chars().count() <= MAX_CONFIG_CHARS {
                assert_eq!(parse_hf_config(text).as_ref(), Err(e));
            }
        }
        (Err(HubError::Config(_)), None) => {}
        (Err(other), _) => panic!("a body cannot fail with {other:?}"),
    }
}

/// `hub`: a Hub id as typed in the page or given to `memest --hub`.
///
/// - `HubId::parse` never panics;
/// - an accepted id prints as text that reads back as the same id;
/// - its `config_url` is on the Hub's origin, has exactly the six path segments
///   `owner/name/resolve/revision/config.json` and only characters that need no escaping in
///   a URL path, with no `.` or `..` segment: nothing typed can point the request elsewhere.
pub fn check_hub_id(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let Ok(id) = HubId::parse(&text) else {
        return;
    };
    assert_eq!(HubId::parse(&id.to_string()).as_ref(), Ok(&id), "{text:?}");
    let url = id.config_url();
    let path = url
        .strip_prefix(HUB_ORIGIN)
        .and_then(|p| p.strip_prefix('/'))
        .unwrap_or_else(|| panic!("{url} is not on the Hub"));
    let segments: Vec<&str> = path.split('/').collect();
    assert_eq!(segments.len(), 5, "{url}");
    assert_eq!(segments[2], "resolve", "{url}");
    assert_eq!(segments[4], "config.json", "{url}");
    assert_eq!(segments[0], id.owner());
    assert_eq!(segments[1], id.name());
    for segment in &segments {
        assert!(
            !segment.is_empty() && *segment != "." && *segment != "..",
            "{url}"
        );
        assert!(
            segment
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.' | b'%')),
            "{url}"
        );
    }
    assert_eq!(segments[3].replace("%2F", "/"), id.revision(), "{url}");
}

/// `numbers`: the number fields and percent-coding on arbitrary text.
///
/// - every parser stays within its documented bounds (`1..=MAX_BATCH`, `1..=MAX_PARAMS`,
///   `1..=10^7 MB`);
/// - a whole number accepted by one field reads the same in the others that can hold it,
///   and reads back from its own decimal form;
/// - percent-coding round-trips, and decoding never panics.
pub fn check_numbers(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let text = text.as_ref();

    let batch = parse_batch(text);
    if let Ok(b) = batch {
        assert!((1..=MAX_BATCH).contains(&b), "batch {b} from {text:?}");
        assert_eq!(parse_batch(&b.to_string()), Ok(b));
        // A batch is a plain whole count, so it is also a valid parameter count.
        assert_eq!(parse_params(text, ParamUnit::Plain), Ok(b), "{text:?}");
    }
    for unit in ParamUnit::ALL {
        if let Ok(p) = parse_params(text, unit) {
            assert!(
                (1..=MAX_PARAMS).contains(&p),
                "{p} params from {text:?} {unit:?}"
            );
            assert_eq!(parse_params(&p.to_string(), ParamUnit::Plain), Ok(p));
        }
    }
    let activation = parse_activation_mb(text);
    if let Ok(a) = activation {
        // 0 is valid: the model state alone
        assert!(
            (0..=MAX_ACTIVATION_BYTES).contains(&a),
            "{a} activation bytes from {text:?}"
        );
    }
    if let Ok(whole) = parse_params(text, ParamUnit::Plain) {
        // A whole number of MB is that many million bytes exactly, when it is small enough.
        if let Some(bytes) = whole
            .checked_mul(BYTES_PER_MB)
            .filter(|b| *b <= MAX_ACTIVATION_BYTES)
        {
            assert_eq!(activation, Ok(bytes), "{text:?}");
        }
    }

    assert_eq!(percent_decode(&percent_encode(text)).as_deref(), Ok(text));
    if let Ok(decoded) = percent_decode(text) {
        assert_eq!(
            percent_decode(&percent_encode(&decoded)).as_deref(),
            Ok(decoded.as_str())
        );
    }
}
