//! The page's inputs as a query string (for shared links) and back.
//!
//! Every input travels under a short key. Decoding never fails: a bad or unknown part is
//! dropped, its default kept, and a notice says what was ignored.

use crate::number::parse_u64;
use crate::state::{Field, PageState};
use crate::FieldError;

/// The result of reading a query string or stored state.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Decoded {
    /// The inputs, with defaults wherever the text was bad or silent.
    pub state: PageState,
    /// One line per part that was ignored, for a person to read.
    pub notices: Vec<String>,
}

/// Longest value kept for a key (a pasted `config.json` may be longer: see [`Field`]).
const MAX_NOTICE_VALUE_CHARS: usize = 40;
/// More notices than this are summarised in one line.
const MAX_NOTICES: usize = 8;

/// Encodes every input of `state` as a query string without the leading `?`.
#[must_use]
pub fn encode_query(state: &PageState) -> String {
    let mut parts = Vec::new();
    for field in Field::ALL {
        if !state.travels(field) {
            continue;
        }
        if let Some(value) = state.get(field) {
            parts.push(format!("{}={}", field.key(), percent_encode(&value)));
        }
    }
    crate::sweep::join(&parts, "&")
}

/// Reads a query string (with or without its leading `?`) into inputs and notices.
#[must_use]
pub fn decode_query(query: &str) -> Decoded {
    let mut decoded = Decoded::default();
    // the fields the link gives, by variant index
    let mut seen = [false; Field::ALL.len()];
    let mut notices = Vec::new();
    let mut legacy_data_parallel: Option<String> = None;
    let query = query.strip_prefix('?').unwrap_or(query);
    for part in query.split('&').filter(|p| !p.is_empty()) {
        let (raw_key, raw_value) = part.split_once('=').unwrap_or((part, ""));
        let key = match percent_decode(raw_key) {
            Ok(key) => key,
            Err(why) => {
                notices.push(format!("Ignored a part of the link: its name is {why}."));
                continue;
            }
        };
        // before the job's GPUs (`gpus`), links gave the data-parallel GPUs (`n`)
        if key == "n" && legacy_data_parallel.is_none() {
            legacy_data_parallel = Some(percent_decode(raw_value).unwrap_or_default());
            continue;
        }
        let Some(field) = Field::from_key(&key) else {
            notices.push(format!("Ignored unknown setting “{}”.", shorten(&key)));
            continue;
        };
        if seen[field as usize] {
            notices.push(format!(
                "Ignored a repeated “{}”: the first one is used.",
                field.key()
            ));
            continue;
        }
        seen[field as usize] = true;
        let value = match percent_decode(raw_value) {
            Ok(value) => value,
            Err(why) => {
                notices.push(format!(
                    "Ignored {}: its value is {why}; using the default.",
                    field.label()
                ));
                continue;
            }
        };
        if let Err(why) = decoded.state.set(field, &value) {
            notices.push(ignored_value(field, &value, &why));
        }
    }
    // links from before the allocator was replayed carry its old flat default: replay it
    if !seen[Field::Allocator as usize] && decoded.state.hardware.allocator_reserve_percent == "5" {
        decoded.state.hardware.allocator_reserve_percent.clear();
    }
    // links from before the implementation could be chosen meant torch.optim's own default
    if seen.contains(&true) && !seen[Field::OptimizerImpl as usize] {
        decoded.state.step.optimizer_impl = crate::OptimizerImpl::Foreach;
    }
    let seen_legacy = legacy_data_parallel.is_some();
    // a link without either gave one data-parallel replica
    let legacy_data_parallel = legacy_data_parallel.or_else(|| Some("1".to_owned()));
    if let Some(n) = legacy_data_parallel.filter(|_| !seen[Field::NumGpus as usize]) {
        let p = &decoded.state.parallel;
        let group = |text: &str| parse_u64(text.trim()).unwrap_or(1).max(1);
        let groups = group(&p.tensor_parallel)
            .saturating_mul(group(&p.context_parallel))
            .saturating_mul(group(&p.pipeline_parallel));
        let total = match parse_u64(n.trim()) {
            Some(n) => n.saturating_mul(groups).to_string(),
            None => n,
        };
        if groups > 1 && seen_legacy {
            notices.push(format!(
                "Read the link's {} data-parallel GPUs as {} GPUs in all (times tensor, context and pipeline parallel).",
                shorten(n_text(&total, groups).as_str()),
                shorten(&total)
            ));
        }
        if decoded.state.set(Field::NumGpus, &total).is_ok() && seen_legacy {
            seen[Field::NumGpus as usize] = true;
        }
    }
    for (field, why) in decoded.state.invalid_text_fields() {
        if seen[field as usize] {
            let typed = decoded.state.get(field).unwrap_or_default();
            notices.push(ignored_value(field, &typed, &why));
        }
        match why {
            // the GPUs must hold the groups: the fewest that do
            FieldError::MustBeMultiple { factor, .. } if field == Field::NumGpus => {
                let _ = decoded.state.set(field, &factor.to_string());
            }
            _ => decoded.state.reset(field),
        }
    }
    if decoded.state.model.preset.is_some() && !decoded.state.model.config_json.is_empty() {
        notices.push("Ignored the link's config.json: the link names a preset model.".to_owned());
        decoded.state.model.config_json.clear();
    }
    if decoded.state.model.preset.is_none() {
        if let Err(why) = decoded.state.architecture() {
            notices.push(format!(
                "Ignored the model's config.json: {why}. Using the default model."
            ));
            decoded.state.reset(Field::Model);
            decoded.state.model.config_json.clear();
        }
    }
    if notices.len() > MAX_NOTICES {
        let more = notices.len() - MAX_NOTICES;
        notices.truncate(MAX_NOTICES);
        notices.push(format!("… and {more} more parts ignored."));
    }
    decoded.notices = notices;
    decoded
}

/// The notice for a value of `field` that is not used (one copy for both places that drop
/// one: a value `set` refuses, a text that does not parse).
fn ignored_value(field: Field, value: &str, why: &dyn std::fmt::Display) -> String {
    format!(
        "Ignored {} “{}”: {why} Using the default.",
        field.label(),
        shorten(value)
    )
}

/// The data-parallel count a legacy link gave, back from its total.
fn n_text(total: &str, groups: u64) -> String {
    parse_u64(total).map_or_else(|| total.to_owned(), |t| (t / groups.max(1)).to_string())
}

fn shorten(value: &str) -> String {
    let mut chars = value.chars();
    let head: String = chars.by_ref().take(MAX_NOTICE_VALUE_CHARS).collect();
    if chars.next().is_some() {
        format!("{head}…")
    } else {
        head
    }
}

/// Percent-encodes everything but unreserved characters (RFC 3986).
#[must_use]
pub fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// The byte the two bytes after a `%` spell, as `u8::from_str_radix(hex, 16)` reads them
/// (which takes `+F` for 15 too), written out to keep the standard library's integer parser
/// out of the bundle.
fn hex_byte(hex: &[u8]) -> Option<u8> {
    let digit = |b: u8| char::from(b).to_digit(16);
    let value = match *hex {
        [b'+', low] => digit(low)?,
        [high, low] => digit(high)? * 16 + digit(low)?,
        _ => return None,
    };
    u8::try_from(value).ok()
}

/// Decodes `%XX` escapes and `+` (a space in query strings).
///
/// # Errors
/// A short description of what is malformed.
pub fn percent_decode(text: &str) -> Result<String, &'static str> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = bytes.get(i + 1..i + 3).ok_or("cut short after a %")?;
                out.push(hex_byte(hex).ok_or("badly percent-encoded")?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            other => {
                out.push(other);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| "not valid UTF-8")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Mode;
    use crate::{ByteUnit, Optimizer, ParamUnit, Precision};
    use proptest::prelude::*;

    #[test]
    fn default_state_round_trips() {
        let state = PageState::default();
        assert_eq!(decode_query(&encode_query(&state)).state, state);
        assert!(decode_query(&encode_query(&state)).notices.is_empty());
    }

    #[test]
    fn reads_a_hand_written_link() {
        let d = decode_query("?p=70&pu=B&pr=fp32&o=sgd-momentum&b=4&a=256&u=gib");
        assert!(d.notices.is_empty(), "{:?}", d.notices);
        assert_eq!(d.state.simple.params, "70");
        assert_eq!(d.state.simple.params_unit, ParamUnit::Billion);
        assert_eq!(d.state.simple.precision, Precision::Fp32);
        assert_eq!(d.state.step.optimizer, Optimizer::SgdMomentum);
        assert_eq!(d.state.step.batch, "4");
        assert_eq!(d.state.simple.activation_mb, "256");
        assert_eq!(d.state.byte_unit, ByteUnit::Gib);
        assert_eq!(d.state.mode, Mode::Simple);
    }

    #[track_caller]
    fn falls_back(query: &str, expected_notices: usize) {
        let d = decode_query(query);
        assert_eq!(
            d.notices.len(),
            expected_notices,
            "{query}: {:?}",
            d.notices
        );
    }

    #[test]
    fn the_gpus_are_the_job_s_and_old_links_keep_their_data_parallel_count() {
        let gpus = |query: &str| decode_query(query).state.parallel.num_gpus;
        // `n` was the data-parallel GPUs: times the tensor and pipeline groups
        assert_eq!(gpus("n=2&tp=8&pp=4"), "64");
        assert_eq!(gpus("n=4"), "4");
        // without either, one replica of the groups
        assert_eq!(gpus("tp=8"), "8");
        assert_eq!(gpus("gpus=64&tp=8&pp=4"), "64");
        assert_eq!(gpus("gpus=64&n=3"), "64");
        let d = decode_query("n=2&tp=8");
        assert_eq!(d.notices.len(), 1, "{:?}", d.notices);
        assert!(d.notices[0].contains("16 GPUs in all"), "{:?}", d.notices);
        // not a multiple of the groups: the field says why, a link falls back to the fewest
        let mut state = PageState::default();
        state.set(Field::TensorParallel, "4").unwrap();
        state.set(Field::NumGpus, "6").unwrap();
        let errors = state.plan_field_errors();
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].0, Field::NumGpus);
        assert_eq!(
            errors[0].1.to_string(),
            "Must be a multiple of tensor × context × pipeline parallel (4)."
        );
        let d = decode_query("gpus=6&tp=4");
        assert_eq!(d.state.parallel.num_gpus, "4");
        assert!(decode_query(&encode_query(&d.state)).notices.is_empty());
    }

    #[test]
    fn links_from_before_the_optimizer_implementation_keep_torch_s_default() {
        use crate::OptimizerImpl;
        let implementation = |query: &str| decode_query(query).state.step.optimizer_impl;
        // a first visit is HF Trainer's default, fused AdamW
        assert_eq!(implementation(""), OptimizerImpl::Fused);
        // a link without `oi` was made when every AdamW was foreach
        assert_eq!(implementation("m=arch&o=adamw"), OptimizerImpl::Foreach);
        for i in OptimizerImpl::ALL {
            assert_eq!(implementation(&format!("oi={}", i.key())), i);
            assert_eq!(OptimizerImpl::from_key(i.key()), Some(i));
        }
        falls_back("oi=turbo", 1);
    }

    #[test]
    fn bad_parts_fall_back_with_a_notice_each() {
        falls_back("b=abc", 1);
        falls_back("b=2.5&p=-1", 2);
        falls_back("zzz=1", 1);
        falls_back("b=4&b=8", 1);
        falls_back("b=%zz", 1);
        falls_back("b=%E2%82", 1);
        falls_back("pr=fp64&o=lion&u=tb&pu=Q", 4);
        falls_back("&&&", 0);
        falls_back("", 0);
        let d = decode_query("b=abc&p=9");
        assert_eq!(d.state.step.batch, PageState::default().step.batch);
        assert_eq!(d.state.simple.params, "9");
        assert!(d.notices[0].contains("“abc”"), "{:?}", d.notices);
    }

    #[test]
    fn script_tags_stay_text() {
        let d = decode_query("b=%3Cscript%3Ealert(1)%3C%2Fscript%3E");
        assert_eq!(d.state.step.batch, PageState::default().step.batch);
        assert!(d.notices[0].contains("<script>"));
    }

    #[track_caller]
    fn round_trips(query: &str) {
        let d = decode_query(query);
        assert!(d.notices.is_empty(), "{query}: {:?}", d.notices);
        let again = decode_query(&encode_query(&d.state));
        assert!(again.notices.is_empty(), "{:?}", again.notices);
        assert_eq!(again.state, d.state, "{query}");
    }

    #[test]
    fn formats_devices_and_zero_activations_round_trip() {
        use crate::{Gpu, KvDtype, WeightFormat};
        for f in WeightFormat::ALL {
            round_trips(&format!("m=arch&o=none&wf={}", f.key()));
        }
        for k in KvDtype::ALL {
            round_trips(&format!("m=arch&o=none&gen=64&kvd={}", k.key()));
        }
        for gpu in Gpu::ALL {
            round_trips(&format!("gpu={}", gpu.key()));
        }
        round_trips("gpu=cpu&ram=12.5");
        round_trips("a=0");
        let d = decode_query("wf=Q4_K_M&kvd=q8_0&gpu=mac-64&ram=128&a=0");
        assert!(d.notices.is_empty(), "{:?}", d.notices);
        assert_eq!(d.state.inference.weight_format, WeightFormat::Q4KM);
        assert_eq!(d.state.inference.kv_dtype, KvDtype::Q8_0);
        assert_eq!(d.state.hardware.gpu, Some(Gpu::Mac64));
        assert_eq!(d.state.hardware.ram_gib, "128");
        assert_eq!(d.state.simple.activation_mb, "0");
        // defaults: today's behaviour, and old links read as before
        let old = decode_query("m=arch&o=none&gen=64").state;
        assert_eq!(old.inference.weight_format, WeightFormat::Recipe);
        assert_eq!(old.inference.kv_dtype, KvDtype::Model);
        falls_back("wf=int3&kvd=fp4&ram=0", 3);
    }

    #[test]
    fn serving_fields_round_trip_and_stay_out_of_other_links() {
        round_trips("m=arch&o=none&srv=on&gmu=0.95&mml=8192&mns=64&mbt=4096&eager=on&fis=on&kvd=fp8&wf=mxfp4");
        round_trips("m=arch&o=none&srv=on&gmu=0.9764&mml=");
        let d = decode_query("m=arch&o=none&srv=on&gmu=0.5&mml=32768");
        assert!(d.state.inference.serve);
        assert_eq!(d.state.inference.gpu_memory_utilization, "0.5");
        assert_eq!(d.state.inference.max_model_len, "32768");
        // at their defaults they are not written: older links read the same
        let link = encode_query(&PageState::default());
        for key in ["srv=", "gmu=", "mml=", "mns=", "mbt=", "eager=", "fis="] {
            assert!(!link.contains(key), "{key} in {link}");
        }
        falls_back("srv=maybe&eager=2", 2);
        // a value out of range falls back to the default, with a notice
        let bad = decode_query("m=arch&o=none&srv=on&gmu=1.5");
        assert_eq!(bad.notices.len(), 1, "{:?}", bad.notices);
        assert_eq!(bad.state.inference.gpu_memory_utilization, "0.9");
    }

    #[cfg(feature = "vision")]
    #[test]
    fn image_fields_round_trip_and_stay_out_of_other_links() {
        round_trips("m=arch&img=3&isz=1344x896&vt=trained&vp=frozen");
        round_trips("m=arch&img=1");
        let d = decode_query("img=2&isz=640x480&vt=trained");
        assert_eq!(d.state.vision.images, "2");
        assert_eq!(d.state.vision.image_size, "640x480");
        assert!(d.state.vision.tower_trained && d.state.vision.projector_trained);
        // at their defaults the image fields are not written: older links read the same
        let defaults = crate::PageState::default();
        let link = encode_query(&defaults);
        for key in ["img=", "isz=", "vt=", "vp="] {
            assert!(!link.contains(key), "{key} in {link}");
        }
        // ... but their controls show them
        for (field, shown) in [
            (Field::Images, "0"),
            (Field::ImageSize, "1024x768"),
            (Field::VisionTower, "frozen"),
            (Field::Projector, "trained"),
        ] {
            assert_eq!(defaults.get(field).as_deref(), Some(shown), "{field:?}");
        }
        falls_back("vt=maybe&vp=yes", 2);
    }

    /// Without the `vision` feature (the page's build) the image keys are unknown settings.
    #[cfg(not(feature = "vision"))]
    #[test]
    fn image_fields_are_unknown_without_vision() {
        let d = decode_query("m=arch&img=2&isz=640x480");
        assert_eq!(d.notices.len(), 2, "{:?}", d.notices);
        assert!(d
            .notices
            .iter()
            .all(|n| n.starts_with("Ignored unknown setting")));
        assert_eq!(d.state, decode_query("m=arch").state);
    }

    #[test]
    fn percent_coding_round_trips() {
        for text in ["", "a b", "100%", "ü→😀", "&=?#+"] {
            assert_eq!(percent_decode(&percent_encode(text)).as_deref(), Ok(text));
        }
    }

    #[test]
    fn hex_bytes_read_as_from_str_radix_reads_them() {
        // every pair of bytes that can follow a `%`
        for hex in (0..=u16::MAX).map(u16::to_be_bytes) {
            let std = std::str::from_utf8(&hex)
                .ok()
                .and_then(|h| u8::from_str_radix(h, 16).ok());
            assert_eq!(hex_byte(&hex), std, "{hex:?}");
        }
    }

    proptest! {
        #[test]
        fn decoding_never_panics(query in ".{0,200}") {
            let d = decode_query(&query);
            prop_assert!(d.notices.len() <= MAX_NOTICES + 1);
        }

        #[test]
        fn valid_states_round_trip(
            params in 1u64..100_000, batch in 1u64..100_000, act in 1u64..100_000,
            unit in 0usize..4, precision in 0usize..3, optimizer in 0usize..4, gib: bool,
        ) {
            let state = {
                let mut page_state = PageState {
                    byte_unit: if gib { ByteUnit::Gib } else { ByteUnit::Gb },
                    ..PageState::default()
                };
                page_state.simple.params = params.to_string();
                page_state.simple.params_unit = ParamUnit::ALL[unit];
                page_state.simple.precision = Precision::ALL[precision];
                page_state.step.optimizer = Optimizer::ALL[optimizer];
                page_state.step.batch = batch.to_string();
                page_state.simple.activation_mb = act.to_string();
                page_state
            };
            let d = decode_query(&encode_query(&state));
            prop_assert!(d.notices.is_empty(), "{:?}", d.notices);
            prop_assert_eq!(d.state, state);
        }
    }
}
