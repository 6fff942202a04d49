//! A model on the Hugging Face Hub by its id: the id's rules, the address of its
//! `config.json`, and the Hub's answer read as an input like a pasted config (the same size
//! cap, the same reader), with errors a person can act on. No I/O here: the page fetches
//! with the browser's `fetch`, the CLI with `curl`; both go through these.

use crate::{parse_hf_config, ConfigError, MAX_CONFIG_CHARS};
use std::fmt;

/// The Hub's origin: the only host the page may fetch from (its CSP's `connect-src`).
pub const HUB_ORIGIN: &str = "https://huggingface.co";
/// Longest owner or name (`huggingface_hub`'s `validate_repo_id`: 96).
pub const MAX_HUB_NAME_CHARS: usize = 96;
/// Longest revision: a branch, a tag or a commit.
pub const MAX_HUB_REVISION_CHARS: usize = 128;
/// Seconds the Hub has to answer before the fetch is abandoned.
pub const HUB_TIMEOUT_SECS: u32 = 15;
/// UTF-8 takes at most this many bytes a character: a body announced longer than
/// `MAX_CONFIG_CHARS` times this cannot be under the cap, and is refused unread.
const MAX_UTF8_BYTES_PER_CHAR: u64 = 4;

/// A model repository on the Hub: `owner/name`, at a revision (`main` unless given).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HubId {
    owner: String,
    name: String,
    revision: Option<String>,
}

impl HubId {
    /// Reads `owner/name` or `owner/name@revision` (surrounding spaces and a leading
    /// `https://huggingface.co/` are ignored). Owner and name follow the Hub's rules
    /// (`huggingface_hub`'s `validate_repo_id`): letters, digits, `-`, `_` and `.`, at most 96
    /// each, starting and ending with a letter, digit or `_`, no `--` or `..`, the name not
    /// ending in `.git`. A revision is a branch, a tag or a commit: letters, digits, `-`, `_`,
    /// `.` and `/`, no empty or dot-led part, no `..`.
    ///
    /// # Errors
    /// [`HubError::InvalidId`] saying which rule the text breaks.
    pub fn parse(text: &str) -> Result<Self, HubError> {
        let text = text.trim();
        let text = ["https://huggingface.co/", "huggingface.co/"]
            .iter()
            .find_map(|prefix| text.strip_prefix(prefix))
            .unwrap_or(text);
        let (repo, revision) = match text.split_once('@') {
            Some((repo, revision)) => (repo, Some(revision)),
            None => (text, None),
        };
        let (owner, name) = repo.split_once('/').ok_or(HubError::InvalidId(SHAPE))?;
        if !valid_name(owner) || !valid_name(name) || name.ends_with(".git") {
            // a second `/` lands in the name, whose characters exclude it
            return Err(HubError::InvalidId(if name.contains('/') {
                SHAPE
            } else {
                NAME_RULES
            }));
        }
        if let Some(revision) = revision {
            if !valid_revision(revision) {
                return Err(HubError::InvalidId(REVISION_RULES));
            }
        }
        Ok(Self {
            owner: owner.to_owned(),
            name: name.to_owned(),
            revision: revision.map(str::to_owned),
        })
    }

    /// The owner: a user or an organisation.
    #[must_use]
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// The repository's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The revision: the one given, else `main`.
    #[must_use]
    pub fn revision(&self) -> &str {
        self.revision.as_deref().unwrap_or("main")
    }

    /// The revision as one path segment: its `/` percent-encoded (`refs/pr/1` is
    /// `refs%2Fpr%2F1`, as `huggingface_hub` sends it). Every other character a revision may
    /// hold is left as it is in a URL.
    #[must_use]
    pub fn revision_segment(&self) -> String {
        self.revision().replace('/', "%2F")
    }

    /// `https://huggingface.co/<owner>/<name>/resolve/<revision>/config.json`.
    #[must_use]
    pub fn config_url(&self) -> String {
        self.file_url("config.json")
    }

    /// `https://huggingface.co/<owner>/<name>/resolve/<revision>/<file>` (`file` a name
    /// of the repository's top folder, such as `preprocessor_config.json`).
    #[must_use]
    pub fn file_url(&self, file: &str) -> String {
        format!(
            "{HUB_ORIGIN}/{}/{}/resolve/{}/{file}",
            self.owner,
            self.name,
            self.revision_segment()
        )
    }
}

impl fmt::Display for HubId {
    /// `owner/name`, with `@revision` when one was given.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.owner, self.name)?;
        match &self.revision {
            Some(revision) => write!(f, "@{revision}"),
            None => Ok(()),
        }
    }
}

const SHAPE: &str = "write it as owner/name, or owner/name@revision.";
const NAME_RULES: &str = "owner and name take letters, digits, '-', '_' and '.' (no '--' or '..'), at most 96 each, and start and end with a letter or digit.";
const REVISION_RULES: &str =
    "a revision is a branch, tag or commit: letters, digits, '-', '_', '.' and '/'.";

/// An owner or a name by the Hub's rules.
fn valid_name(part: &str) -> bool {
    let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let bytes = part.as_bytes();
    matches!((bytes.first(), bytes.last()), (Some(&a), Some(&z)) if word(a) && word(z))
        && bytes.len() <= MAX_HUB_NAME_CHARS
        && bytes.iter().all(|&c| word(c) || c == b'-' || c == b'.')
        && !doubled(part, b'-')
        && !doubled(part, b'.')
}

/// Whether `text` has the character `c` twice in a row (no substring search: the page's
/// bundle has none).
fn doubled(text: &str, c: u8) -> bool {
    text.as_bytes().windows(2).any(|w| w == [c, c])
}

/// A branch, tag or commit name this page sends: a subset of git's ref names.
fn valid_revision(revision: &str) -> bool {
    revision.len() <= MAX_HUB_REVISION_CHARS
        && revision.split('/').all(|part| {
            !part.is_empty()
                && !part.starts_with('.')
                && !part.ends_with(".lock")
                && part
                    .bytes()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        })
        && !doubled(revision, b'.')
}

/// Why a model could not be read from the Hub: each says what a person can do about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HubError {
    /// The text is not a Hub id: which rule it breaks.
    InvalidId(&'static str),
    /// HTTP 404: no such repository, revision or file.
    NotFound,
    /// HTTP 401 or 403: the repository is gated or private (the Hub answers 401 for a
    /// repository that does not exist too, to someone not logged in).
    Gated(u16),
    /// Another HTTP status that is not a success.
    Status(u16),
    /// No answer: no network, or the host could not be reached.
    Unreachable,
    /// No answer within [`HUB_TIMEOUT_SECS`].
    Timeout,
    /// The body is longer than [`MAX_CONFIG_CHARS`] characters.
    TooLarge,
    /// The body is not a config this estimator reads: not JSON, or an unsupported
    /// `model_type` (with the list), or a field it cannot use.
    Config(ConfigError),
}

impl HubError {
    /// The error an HTTP status means, `None` for a success (2xx).
    #[must_use]
    pub fn from_status(status: u16) -> Option<Self> {
        match status {
            200..=299 => None,
            404 | 410 => Some(Self::NotFound),
            401 | 403 => Some(Self::Gated(status)),
            _ => Some(Self::Status(status)),
        }
    }
}

impl fmt::Display for HubError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidId(why) => write!(f, "Not a Hub id: {why}"),
            Self::NotFound => write!(
                f,
                "Not found on the Hub (HTTP 404): check the owner, the name and the revision."
            ),
            Self::Gated(status) => write!(
                f,
                "The Hub refused (HTTP {status}): the model is gated or private, or does not exist. Log in on the Hub and paste the config instead."
            ),
            Self::Status(status) => write!(
                f,
                "The Hub answered HTTP {status}: try again later, or paste the config."
            ),
            Self::Unreachable => write!(
                f,
                "Could not reach huggingface.co: no network? Paste or upload the config instead."
            ),
            Self::Timeout => write!(
                f,
                "No answer from huggingface.co within {HUB_TIMEOUT_SECS} s: try again, or paste the config."
            ),
            Self::TooLarge => write!(
                f,
                "The config.json is longer than {MAX_CONFIG_CHARS} characters: refused."
            ),
            Self::Config(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for HubError {}

/// The body of the Hub's answer, read piece by piece: refused as soon as it holds more than
/// [`MAX_CONFIG_CHARS`] characters (the cap of a pasted config), without reading the rest.
#[derive(Clone, Debug, Default)]
pub struct ConfigBody {
    bytes: Vec<u8>,
    /// Characters so far, if the bytes are UTF-8: the bytes that start one.
    chars: usize,
}

impl ConfigBody {
    /// A body whose length the answer announces (`Content-Length`), if it does.
    ///
    /// # Errors
    /// [`HubError::TooLarge`] when the announced length cannot be under the cap.
    pub fn new(announced: Option<u64>) -> Result<Self, HubError> {
        let cap = MAX_CONFIG_CHARS as u64 * MAX_UTF8_BYTES_PER_CHAR;
        if announced.is_some_and(|n| n > cap) {
            return Err(HubError::TooLarge);
        }
        Ok(Self::default())
    }

    /// Takes the next piece of the body.
    ///
    /// # Errors
    /// [`HubError::TooLarge`] once the body holds more than [`MAX_CONFIG_CHARS`] characters:
    /// stop reading then.
    pub fn push(&mut self, piece: &[u8]) -> Result<(), HubError> {
        // a byte that is not a continuation byte (10xxxxxx) starts a character
        self.chars += piece.iter().filter(|&&b| b & 0xC0 != 0x80).count();
        if self.chars > MAX_CONFIG_CHARS {
            return Err(HubError::TooLarge);
        }
        self.bytes.extend_from_slice(piece);
        Ok(())
    }

    /// The whole body as the text of a config the estimator reads (a byte-order mark
    /// dropped).
    ///
    /// # Errors
    /// [`HubError::Config`]: not UTF-8, not JSON, or not a config [`parse_hf_config`] reads.
    pub fn finish(self) -> Result<String, HubError> {
        let text = self.finish_text()?;
        parse_hf_config(&text).map_err(HubError::Config)?;
        Ok(text)
    }

    /// The whole body as text, not read as a config (a byte-order mark dropped): another
    /// file of the repository, such as a `preprocessor_config.json`.
    ///
    /// # Errors
    /// [`HubError::Config`] when it is not UTF-8.
    pub fn finish_text(self) -> Result<String, HubError> {
        let text = String::from_utf8(self.bytes)
            .map_err(|_| HubError::Config(ConfigError::InvalidJson("not UTF-8 text".into())))?;
        Ok(match text.strip_prefix('\u{feff}') {
            Some(rest) => rest.to_owned(),
            None => text,
        })
    }
}

/// Reads a whole body at once (the CLI's, and the tests'): [`ConfigBody`] in one piece.
///
/// # Errors
/// As [`ConfigBody::push`] and [`ConfigBody::finish`].
pub fn read_config_body(body: &[u8]) -> Result<String, HubError> {
    let mut reader = ConfigBody::new(Some(body.len() as u64))?;
    reader.push(body)?;
    reader.finish()
}

/// The file of a vision-language model's repository that holds its processor's sizes.
pub const PREPROCESSOR_FILE: &str = "preprocessor_config.json";

/// Whether `config` (a fetched `config.json`) is a vision-language model's without its
/// processor's sizes: its repository's [`PREPROCESSOR_FILE`] is then worth fetching (without
/// it the readers take the sizes the checkpoints publish).
#[must_use]
pub fn wants_preprocessor(config: &str) -> bool {
    crate::json::parse(config).is_ok_and(|v| {
        v.as_object().is_some_and(|m| {
            m.get("vision_config").is_some() && m.get("preprocessor_config").is_none()
        })
    })
}

/// `config` with `preprocessor` (a [`PREPROCESSOR_FILE`]) under `preprocessor_config`, where
/// the config readers take the processor's sizes from (the CLI puts it there too); `None` when
/// `config` does not want one ([`wants_preprocessor`]), `preprocessor` is no JSON object, or
/// the two together would pass the cap of a pasted config.
#[must_use]
pub fn with_preprocessor(config: &str, preprocessor: &str) -> Option<String> {
    if !wants_preprocessor(config) {
        return None;
    }
    crate::json::parse(preprocessor).ok()?.as_object()?;
    let body = config.trim_end().strip_suffix('}')?;
    let joined = format!("{body},\"preprocessor_config\":{}}}", preprocessor.trim());
    // (past the pasted configs' cap the config would be refused: it stays without)
    (joined.chars().count() <= MAX_CONFIG_CHARS).then_some(joined)
}

#[cfg(test)]
mod tests {

    /// Qwen2.5-VL-7B-Instruct's `preprocessor_config.json` as the Hub serves it (the e2e
    /// tests serve the same file), with its largest image at `max_pixels`.
    #[cfg(feature = "vision")]
    fn qwen_preprocessor(max_pixels: u64) -> String {
        include_str!("../tests/fixtures/configs/qwen2.5-vl-7b-preprocessor.json")
            .replace("12845056", &max_pixels.to_string())
    }

    /// The tokens of one 1280 x 1280 image, with `config` as the page's model.
    #[cfg(feature = "vision")]
    #[track_caller]
    fn image_tokens_of(config: &str) -> u64 {
        let mut state = crate::decode_query("m=arch&img=1&isz=1280x1280").state;
        state.model.preset = None;
        state.model.config_json = config.to_owned();
        let page = crate::parse_page(&state);
        assert!(
            page.field_errors.is_empty() && page.config_error.is_none(),
            "{page:?}"
        );
        let t = page.image_tokens.expect("image tokens");
        t.image_tokens + t.markup_tokens
    }

    #[cfg(feature = "vision")]
    #[test]
    fn a_fetched_preprocessor_joins_its_config() {
        let config = include_str!("../tests/fixtures/configs/qwen2.5-vl-7b.json");
        assert!(wants_preprocessor(config));
        // the published sizes are the readers' defaults: the same 2,118 tokens
        let published = with_preprocessor(config, &qwen_preprocessor(12_845_056)).expect("joins");
        assert!(!wants_preprocessor(&published), "one is enough");
        assert_eq!(image_tokens_of(config), 2_118);
        assert_eq!(image_tokens_of(&published), 2_118);
        // a checkpoint whose processor caps images at 28 x 28 x 1280 pixels (the class
        // default): 1280 x 1280 is resized to 980 x 980, 35 x 35 merged patches and the markers
        let capped = with_preprocessor(config, &qwen_preprocessor(1_003_520)).expect("joins");
        assert_eq!(image_tokens_of(&capped), 35 * 35 + 2);
        // nothing is joined where nothing is wanted, or to what is no object
        for (config, preprocessor) in [
            (config, "[]"),
            (config, "not json"),
            (published.as_str(), "{}"),
            (r#"{"model_type":"llama","hidden_size":8}"#, "{}"),
            ("not json", "{}"),
        ] {
            assert_eq!(
                with_preprocessor(config, preprocessor),
                None,
                "{config:.40} {preprocessor}"
            );
        }
    }
    use super::*;

    /// `text` reads as the id whose config lives at `url`, and prints as `shown`.
    #[track_caller]
    fn reads(text: &str, url: &str, shown: &str) {
        let id = HubId::parse(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        assert_eq!(id.config_url(), url, "{text:?}");
        assert_eq!(id.to_string(), shown, "{text:?}");
        assert_eq!(
            HubId::parse(shown).as_ref(),
            Ok(&id),
            "{shown:?} reads back"
        );
    }

    /// `text` is refused for breaking the rule `why`.
    #[track_caller]
    fn refused(text: &str, why: &str) {
        assert_eq!(
            HubId::parse(text),
            Err(HubError::InvalidId(match why {
                "shape" => SHAPE,
                "name" => NAME_RULES,
                "revision" => REVISION_RULES,
                other => panic!("no rule {other}"),
            })),
            "{text:?}"
        );
    }

    const RESOLVE: &str = "https://huggingface.co/";

    #[test]
    fn ids_and_their_config_urls() {
        for (text, path, shown) in [
            (
                "Qwen/Qwen2.5-7B",
                "Qwen/Qwen2.5-7B/resolve/main",
                "Qwen/Qwen2.5-7B",
            ),
            (
                "  meta-llama/Llama-3.1-8B \n",
                "meta-llama/Llama-3.1-8B/resolve/main",
                "meta-llama/Llama-3.1-8B",
            ),
            (
                "openai-community/gpt2@main",
                "openai-community/gpt2/resolve/main",
                "openai-community/gpt2@main",
            ),
            (
                "google/gemma-3-4b-it@v1.0",
                "google/gemma-3-4b-it/resolve/v1.0",
                "google/gemma-3-4b-it@v1.0",
            ),
            (
                "a/b@607a30d783dfa663caf39e06633721c8d4cfcd7e",
                "a/b/resolve/607a30d783dfa663caf39e06633721c8d4cfcd7e",
                "a/b@607a30d783dfa663caf39e06633721c8d4cfcd7e",
            ),
            (
                "org_1/m.v2_x@refs/pr/12",
                "org_1/m.v2_x/resolve/refs%2Fpr%2F12",
                "org_1/m.v2_x@refs/pr/12",
            ),
            (
                "https://huggingface.co/Qwen/Qwen3-8B",
                "Qwen/Qwen3-8B/resolve/main",
                "Qwen/Qwen3-8B",
            ),
            (
                "huggingface.co/Qwen/Qwen3-8B@dev",
                "Qwen/Qwen3-8B/resolve/dev",
                "Qwen/Qwen3-8B@dev",
            ),
            ("_/_", "_/_/resolve/main", "_/_"),
        ] {
            reads(text, &format!("{RESOLVE}{path}/config.json"), shown);
        }
        let longest = "x".repeat(MAX_HUB_NAME_CHARS);
        reads(
            &format!("{longest}/{longest}"),
            &format!("{RESOLVE}{longest}/{longest}/resolve/main/config.json"),
            &format!("{longest}/{longest}"),
        );
    }

    #[test]
    fn ids_the_hub_refuses() {
        for (text, why) in [
            ("", "shape"),
            ("gpt2", "shape"),
            ("   ", "shape"),
            ("@main", "shape"),
            ("a/b/c", "shape"),
            ("https://huggingface.co/a/b/tree/main", "shape"),
            ("http://example.com/a", "shape"),
            ("/name", "name"),
            ("owner/", "name"),
            ("a//b", "shape"),
            ("../etc", "name"),
            ("a/..", "name"),
            ("a/b..c", "name"),
            ("a/b--c", "name"),
            ("-a/b", "name"),
            ("a/b-", "name"),
            ("a/.b", "name"),
            ("a/b.", "name"),
            ("a/b.git", "name"),
            ("a b/c", "name"),
            ("a/b c", "name"),
            ("a/b?x=1", "name"),
            ("a/b#x", "name"),
            ("a/b%2F", "name"),
            ("a/b\\c", "name"),
            ("ä/b", "name"),
            ("a/b@", "revision"),
            ("a/b@/main", "revision"),
            ("a/b@main/", "revision"),
            ("a/b@a//b", "revision"),
            ("a/b@..", "revision"),
            ("a/b@a..b", "revision"),
            ("a/b@.hidden", "revision"),
            ("a/b@x/.y", "revision"),
            ("a/b@main.lock", "revision"),
            ("a/b@ma in", "revision"),
            ("a/b@main@x", "revision"),
            ("a/b@main?x", "revision"),
            ("a/b@%2e%2e", "revision"),
        ] {
            refused(text, why);
        }
        let long = "x".repeat(MAX_HUB_NAME_CHARS + 1);
        refused(&format!("{long}/b"), "name");
        refused(&format!("a/{long}"), "name");
        refused(
            &format!("a/b@{}", "r".repeat(MAX_HUB_REVISION_CHARS + 1)),
            "revision",
        );
    }

    #[test]
    fn statuses() {
        for (status, error) in [
            (200, None),
            (204, None),
            (404, Some(HubError::NotFound)),
            (410, Some(HubError::NotFound)),
            (401, Some(HubError::Gated(401))),
            (403, Some(HubError::Gated(403))),
            (500, Some(HubError::Status(500))),
            (429, Some(HubError::Status(429))),
            (302, Some(HubError::Status(302))),
        ] {
            assert_eq!(HubError::from_status(status), error, "{status}");
        }
        let gated = HubError::Gated(401).to_string();
        assert!(gated.contains("gated") && gated.contains("paste the config"));
    }

    const GPT2: &str = r#"{"model_type":"gpt2","n_layer":2,"n_embd":64,"n_head":2,"vocab_size":100,"n_positions":64}"#;

    /// `body`, in pieces of `piece` bytes, is refused with `error` or read as a config.
    #[track_caller]
    fn body_reads(body: &[u8], piece: usize, expected: Result<(), HubError>) {
        let mut reader = ConfigBody::new(None).expect("no length announced");
        let mut outcome = Ok(());
        for chunk in body.chunks(piece.max(1)) {
            outcome = reader.push(chunk);
            if outcome.is_err() {
                break;
            }
        }
        let outcome = outcome.and_then(|()| reader.finish().map(drop));
        assert_eq!(
            outcome,
            expected,
            "{} bytes in pieces of {piece}",
            body.len()
        );
        let whole = read_config_body(body).map(drop);
        assert_eq!(whole, expected, "{} bytes at once", body.len());
    }

    #[test]
    fn bodies_as_configs() {
        let padded = |total_chars: usize, fill: char| {
            let pad = total_chars - GPT2.chars().count() - r#","x":"""#.len();
            let mut text = GPT2.trim_end_matches('}').to_owned();
            text.push_str(r#","x":""#);
            text.extend(std::iter::repeat_n(fill, pad));
            text.push_str("\"}");
            assert_eq!(text.chars().count(), total_chars);
            text
        };
        let unsupported = ConfigError::UnsupportedModelType("t5x".into());
        for piece in [1, 7, 4096, usize::MAX] {
            body_reads(GPT2.as_bytes(), piece, Ok(()));
            body_reads(format!("\u{feff}{GPT2}").as_bytes(), piece, Ok(()));
            // at the cap, in one-byte and in three-byte characters: read
            body_reads(padded(MAX_CONFIG_CHARS, 'x').as_bytes(), piece, Ok(()));
            body_reads(padded(MAX_CONFIG_CHARS, '€').as_bytes(), piece, Ok(()));
            // one character past it: refused
            for fill in ['x', '€'] {
                body_reads(
                    padded(MAX_CONFIG_CHARS + 1, fill).as_bytes(),
                    piece,
                    Err(HubError::TooLarge),
                );
            }
            let html = "<!DOCTYPE html><html>";
            body_reads(
                html.as_bytes(),
                piece,
                Err(HubError::Config(parse_hf_config(html).expect_err("HTML"))),
            );
            body_reads(
                br#"{"model_type":"t5x"}"#,
                piece,
                Err(HubError::Config(unsupported.clone())),
            );
            body_reads(
                b"\xff\xfe{}",
                piece,
                Err(HubError::Config(ConfigError::InvalidJson(
                    "not UTF-8 text".into(),
                ))),
            );
        }
        // an unsupported type's message lists the supported ones
        let message = HubError::Config(unsupported).to_string();
        assert!(
            message.contains("llama") && message.contains("gpt2"),
            "{message}"
        );
    }

    #[test]
    fn an_announced_length_past_what_the_cap_allows_is_refused_unread() {
        let cap = MAX_CONFIG_CHARS as u64 * 4;
        assert!(ConfigBody::new(Some(cap)).is_ok());
        assert!(ConfigBody::new(None).is_ok());
        assert_eq!(
            ConfigBody::new(Some(cap + 1)).map(drop),
            Err(HubError::TooLarge)
        );
        assert_eq!(
            ConfigBody::new(Some(u64::MAX)).map(drop),
            Err(HubError::TooLarge)
        );
    }

    #[test]
    fn a_body_past_the_depth_limit_is_refused_as_a_pasted_one_is() {
        let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
        let pasted = parse_hf_config(&deep).expect_err("too deep");
        assert_eq!(
            read_config_body(deep.as_bytes()),
            Err(HubError::Config(pasted))
        );
    }
}
