//! `--hub owner/name[@revision]`: a model's `config.json` from the Hugging Face Hub.
//!
//! The id is read by the core's [`HubId`], the answer by its [`ConfigBody`] (the page's
//! rules: the same size cap, stopped past it, the same reader). The request is made by
//! spawning `curl`, which every system this runs on has: a Rust HTTPS client (rustls or
//! native-tls, an async runtime or not) would add minutes to the build and megabytes to the
//! binary for one GET. `curl` is started with `-q` (no `~/.curlrc`), HTTPS only (redirects
//! too), no credentials, a timeout.
//!
//! What it fetches is kept in `$XDG_CACHE_HOME/memest/hub/<owner>/<name>/<revision>/`
//! (`~/.cache/...` without `XDG_CACHE_HOME`). When the Hub cannot be reached, or
//! `HF_HUB_OFFLINE` is set, the config comes from that cache, else from Hugging Face's own
//! (`$HF_HUB_CACHE`, or `$HF_HOME/hub`, or `~/.cache/huggingface/hub`:
//! `models--<owner>--<name>/snapshots/<commit>/config.json`, the commit named by
//! `refs/<revision>`). A commit id as the revision is read from a cache first: it never
//! changes.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use estimator_core::{
    read_config_body, ConfigBody, HubError, HubId, HUB_TIMEOUT_SECS, MAX_CONFIG_CHARS,
};

/// The model's config.
const CONFIG: &str = "config.json";
/// A vision-language model's image processor: its sizes decide the image tokens.
const PREPROCESSOR: &str = "preprocessor_config.json";

/// The config of a model on the Hub, and lines for stderr when it came from a cache.
pub struct Loaded {
    /// The text of its `config.json` (a vision-language model's with its
    /// `preprocessor_config.json` under `preprocessor_config`, as the readers take it).
    pub text: String,
    /// Where it came from, when not from the Hub just now.
    pub notices: Vec<String>,
}

/// The caches, from the environment.
struct Caches {
    /// memest's own: `<cache>/memest/hub`.
    own: Option<PathBuf>,
    /// Hugging Face's hub cache.
    hugging_face: Option<PathBuf>,
}

/// An absolute path from the environment variable `name`, if set.
fn env_dir(name: &str) -> Option<PathBuf> {
    std::env::var_os(name)
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
}

impl Caches {
    fn from_env() -> Self {
        let cache_home =
            env_dir("XDG_CACHE_HOME").or_else(|| env_dir("HOME").map(|h| h.join(".cache")));
        Self {
            own: cache_home.as_ref().map(|c| c.join("memest").join("hub")),
            hugging_face: env_dir("HF_HUB_CACHE")
                .or_else(|| env_dir("HF_HOME").map(|h| h.join("hub")))
                .or_else(|| cache_home.map(|c| c.join("huggingface").join("hub"))),
        }
    }

    /// Where memest keeps `file` of `id`.
    fn own_path(&self, id: &HubId, file: &str) -> Option<PathBuf> {
        // the revision as one path segment (`refs/pr/1` as `refs%2Fpr%2F1`)
        Some(
            self.own
                .as_ref()?
                .join(id.owner())
                .join(id.name())
                .join(id.revision_segment())
                .join(file),
        )
    }

    /// `file` of `id` in Hugging Face's cache, if it holds one.
    fn hugging_face_path(&self, id: &HubId, revision_given: bool, file: &str) -> Option<PathBuf> {
        let repo =
            self.hugging_face
                .as_ref()?
                .join(format!("models--{}--{}", id.owner(), id.name()));
        let commit = if is_commit(id.revision()) {
            Some(id.revision().to_owned())
        } else {
            // the revision was checked: parts of letters, digits, `-`, `_`, `.`, none `..`
            std::fs::read_to_string(repo.join("refs").join(id.revision()))
                .ok()
                .map(|c| c.trim().to_owned())
                .filter(|c| is_commit(c))
        };
        if let Some(commit) = commit {
            let path = repo.join("snapshots").join(commit).join(file);
            return path.is_file().then_some(path);
        }
        if revision_given {
            return None;
        }
        // no ref recorded for `main`: the newest snapshot that holds the file
        std::fs::read_dir(repo.join("snapshots"))
            .ok()?
            .filter_map(Result::ok)
            .map(|e| e.path().join(file))
            .filter_map(|p| Some((std::fs::metadata(&p).ok()?.modified().ok()?, p)))
            .max()
            .map(|(_, p)| p)
    }

    /// The first cached copy of `file` of `id`: memest's, then Hugging Face's.
    fn find(&self, id: &HubId, revision_given: bool, file: &str) -> Option<PathBuf> {
        self.own_path(id, file)
            .filter(|p| p.is_file())
            .or_else(|| self.hugging_face_path(id, revision_given, file))
    }

    /// The folders searched, for a message.
    fn searched(&self) -> String {
        let dirs: Vec<String> = [&self.own, &self.hugging_face]
            .into_iter()
            .flatten()
            .map(|d| d.display().to_string())
            .collect();
        if dirs.is_empty() {
            "no cache folder: HOME and XDG_CACHE_HOME are unset".to_owned()
        } else {
            dirs.join(" and ")
        }
    }

    /// Keeps `text` as `file` of `id` (quietly not, where the cache cannot be written).
    fn store(&self, id: &HubId, file: &str, text: &str) {
        let Some(path) = self.own_path(id, file) else {
            return;
        };
        let Some(dir) = path.parent() else { return };
        let partial = dir.join(format!("{file}.{}.partial", std::process::id()));
        let stored = std::fs::create_dir_all(dir)
            .and_then(|()| std::fs::write(&partial, text))
            .and_then(|()| std::fs::rename(&partial, &path));
        if stored.is_err() {
            let _ = std::fs::remove_file(&partial);
        }
    }
}

/// A full commit id (40 lowercase hexadecimal digits).
fn is_commit(revision: &str) -> bool {
    revision.len() == 40
        && revision
            .bytes()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
}

/// Reads a cached config with the same rules as the Hub's answer.
fn read_cached(path: &Path) -> Result<String, String> {
    read_config_body(&read_capped(path)?)
        .map_err(|e| format!("the cached copy {} is unusable: {e}", path.display()))
}

/// Reads a cached file that is no config (a `preprocessor_config.json`), under the same
/// size cap: its text as it is.
fn read_cached_text(path: &Path) -> Option<String> {
    let bytes = read_capped(path).ok()?;
    let mut body = ConfigBody::new(Some(bytes.len() as u64)).ok()?;
    body.push(&bytes).ok()?;
    body.finish_text().ok()
}

/// The bytes of a cached file, one more than any body under the cap can take at most.
fn read_capped(path: &Path) -> Result<Vec<u8>, String> {
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| {
            f.take(MAX_CONFIG_CHARS as u64 * 4 + 1)
                .read_to_end(&mut bytes)
        })
        .map_err(|e| format!("cannot read the cached copy {}: {e}", path.display()))?;
    Ok(bytes)
}

/// Whether `HF_HUB_OFFLINE` asks for no network (`1`, `true`, `yes`, `on`).
fn offline() -> bool {
    std::env::var("HF_HUB_OFFLINE").is_ok_and(|v| {
        matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "1" | "true" | "yes" | "on"
        )
    })
}

/// The config of `id` (`revision_given`: the id named its revision), from the Hub, or from a
/// cache when the Hub cannot be reached or `HF_HUB_OFFLINE` is set; for a vision-language
/// model (a `vision_config`), its `preprocessor_config.json` too when the repository has
/// one: the checkpoint's image sizes, which can differ from the processor class's defaults.
///
/// # Errors
/// A sentence saying what failed and what to do.
pub fn load(id: &HubId, revision_given: bool) -> Result<Loaded, String> {
    let mut loaded = load_config(id, revision_given)?;
    let Ok(serde_json::Value::Object(mut config)) =
        serde_json::from_str::<serde_json::Value>(&loaded.text)
    else {
        return Ok(loaded);
    };
    if !config.contains_key("vision_config") || config.contains_key("preprocessor_config") {
        return Ok(loaded);
    }
    let (preprocessor, notice) = load_preprocessor(id, revision_given);
    loaded.notices.extend(notice);
    if let Some(serde_json::Value::Object(p)) =
        preprocessor.and_then(|text| serde_json::from_str(&text).ok())
    {
        config.insert(
            "preprocessor_config".to_owned(),
            serde_json::Value::Object(p),
        );
        let merged = serde_json::Value::Object(config).to_string();
        if merged.chars().count() <= MAX_CONFIG_CHARS {
            loaded.text = merged;
        } else {
            loaded.notices.push(format!(
                "{id}: {PREPROCESSOR} left out (the config with it is longer than {MAX_CONFIG_CHARS} characters): the image processor's defaults are used"
            ));
        }
    }
    Ok(loaded)
}

/// The `preprocessor_config.json` of `id`: from the Hub, or a cached copy; `None` where the
/// repository has none (the processor's class defaults apply), with a line for stderr when
/// it could not be read.
fn load_preprocessor(id: &HubId, revision_given: bool) -> (Option<String>, Option<String>) {
    let caches = Caches::from_env();
    let cached = || {
        caches
            .find(id, revision_given, PREPROCESSOR)
            .and_then(|path| read_cached_text(&path))
    };
    let offline = offline();
    if offline || is_commit(id.revision()) {
        if let Some(text) = cached() {
            return (Some(text), None);
        }
        if offline {
            return (None, None);
        }
    }
    match download_as(&id.file_url(PREPROCESSOR), ConfigBody::finish_text) {
        Ok(text) => {
            caches.store(id, PREPROCESSOR, &text);
            (Some(text), None)
        }
        Err((HubError::NotFound, _)) => (None, None),
        Err((why, _)) => match cached() {
            Some(text) => (Some(text), None),
            None => {
                let why = match why {
                    HubError::Gated(status) | HubError::Status(status) => format!("HTTP {status}"),
                    HubError::Unreachable => "huggingface.co could not be reached".to_owned(),
                    HubError::Timeout => format!("no answer within {HUB_TIMEOUT_SECS} s"),
                    other => other.to_string(),
                };
                (
                    None,
                    Some(format!(
                        "{id}: {PREPROCESSOR} could not be read ({why}): the image processor's defaults are used"
                    )),
                )
            }
        },
    }
}

/// [`load`]'s `config.json`.
fn load_config(id: &HubId, revision_given: bool) -> Result<Loaded, String> {
    let caches = Caches::from_env();
    let from_cache = |why: &str| -> Result<Loaded, String> {
        let path = caches.find(id, revision_given, CONFIG).ok_or_else(|| {
            format!(
                "{id}: {why}, and no cached copy (looked in {}). Download its config.json and use --config PATH.",
                caches.searched()
            )
        })?;
        let text = read_cached(&path).map_err(|e| format!("{id}: {e}"))?;
        Ok(Loaded {
            text,
            notices: vec![format!(
                "{id}: {why}; using the cached copy {}",
                path.display()
            )],
        })
    };
    if offline() {
        return from_cache("offline (HF_HUB_OFFLINE is set)");
    }
    if is_commit(id.revision()) {
        if let Some(path) = caches.find(id, revision_given, CONFIG) {
            return read_cached(&path)
                .map(|text| Loaded {
                    text,
                    notices: Vec::new(),
                })
                .map_err(|e| format!("{id}: {e}"));
        }
    }
    match download(&id.config_url()) {
        Ok(text) => {
            caches.store(id, CONFIG, &text);
            Ok(Loaded { text, notices: Vec::new() })
        }
        Err((HubError::Unreachable, detail)) => {
            from_cache(&format!("could not reach huggingface.co ({detail})"))
        }
        Err((HubError::Timeout, _)) => from_cache(&format!(
            "no answer from huggingface.co within {HUB_TIMEOUT_SECS} s"
        )),
        Err((HubError::Status(status), _)) if status >= 500 => {
            from_cache(&format!("the Hub answered HTTP {status}"))
        }
        Err((HubError::Gated(status), _)) => from_cache(&format!(
            "the Hub refused (HTTP {status}): the model is gated or private, or does not exist. \
             Log in on the Hub and accept its terms, then download its config.json \
             (`huggingface-cli download {}/{} config.json` puts it where memest reads it) or use --config PATH",
            id.owner(),
            id.name()
        )),
        Err((why, _)) => Err(format!("{id}: {why}")),
    }
}

/// The `curl` line that fetches `url`: no `~/.curlrc` (`-q`, first), HTTPS only (redirects
/// too), no credentials, a timeout, a size limit where the length is announced; the body on
/// stdout, the final HTTP status (`000` without an answer) last on stderr.
fn curl_args(url: &str) -> Vec<String> {
    let timeout = HUB_TIMEOUT_SECS.to_string();
    let most_bytes = (MAX_CONFIG_CHARS * 4).to_string();
    let agent = concat!("memest/", env!("CARGO_PKG_VERSION"));
    [
        "-q",
        "--silent",
        "--show-error",
        "--location",
        "--max-redirs",
        "5",
        "--proto",
        "=https",
        "--proto-redir",
        "=https",
        "--max-time",
        &timeout,
        "--max-filesize",
        &most_bytes,
        "--user-agent",
        agent,
        "--output",
        "-",
        "--write-out",
        "%{stderr}%{http_code}",
        "--",
        url,
    ]
    .map(str::to_owned)
    .to_vec()
}

/// Fetches `url` with `curl` and reads the body as the page does, piece by piece: `curl`
/// is stopped once the body is past the cap.
///
/// # Errors
/// The [`HubError`], with `curl`'s own words when it gave some.
fn download(url: &str) -> Result<String, (HubError, String)> {
    download_as(url, ConfigBody::finish)
}

/// [`download`], the body read by `finish` (a config's reader, or text as it is).
fn download_as(
    url: &str,
    finish: fn(ConfigBody) -> Result<String, HubError>,
) -> Result<String, (HubError, String)> {
    let mut child = Command::new("curl")
        .args(curl_args(url))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            let detail = if e.kind() == std::io::ErrorKind::NotFound {
                "memest fetches with curl, which is not installed".to_owned()
            } else {
                format!("curl could not be started: {e}")
            };
            (HubError::Unreachable, detail)
        })?;
    let mut body = ConfigBody::new(None).map_err(|e| (e, String::new()))?;
    let mut refused = None;
    if let Some(mut stdout) = child.stdout.take() {
        let mut piece = [0u8; 8192];
        loop {
            match stdout.read(&mut piece) {
                Ok(0) => break,
                Ok(n) => {
                    if let Err(e) = body.push(&piece[..n]) {
                        let _ = child.kill();
                        refused = Some(e);
                        break;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => {
                    let _ = child.kill();
                    refused = Some(HubError::Unreachable);
                    break;
                }
            }
        }
    }
    let output = child
        .wait_with_output()
        .map_err(|e| (HubError::Unreachable, e.to_string()))?;
    if let Some(why) = refused {
        return Err((why, String::new()));
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    let stderr = stderr.trim_end();
    // the status is the last three characters (curl's `%{http_code}`)
    let cut = stderr.len().saturating_sub(3);
    let (said, status) = match (stderr.get(..cut), stderr.get(cut..)) {
        (Some(said), Some(code)) if code.len() == 3 && code.bytes().all(|b| b.is_ascii_digit()) => {
            (said, code)
        }
        _ => (stderr, ""),
    };
    let said = said.trim().to_owned();
    let status: u16 = status.parse().unwrap_or(0);
    match output.status.code() {
        Some(0) if status != 0 => match HubError::from_status(status) {
            Some(why) => Err((why, said)),
            None => finish(body).map_err(|e| (e, said)),
        },
        // curl's "operation timed out" and "maximum file size exceeded"
        Some(28) => Err((HubError::Timeout, said)),
        Some(63) => Err((HubError::TooLarge, said)),
        _ if status != 0 => Err((
            HubError::from_status(status).unwrap_or(HubError::Unreachable),
            said,
        )),
        _ => Err((
            HubError::Unreachable,
            if said.is_empty() {
                "curl failed".to_owned()
            } else {
                said
            },
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn curl_reads_no_rc_file_and_speaks_https_only() {
        let args = curl_args("https://huggingface.co/a/b/resolve/main/config.json");
        assert_eq!(args[0], "-q", "-q must come first to skip ~/.curlrc");
        let pair = |flag: &str| {
            let at = args.iter().position(|a| a == flag).unwrap();
            args[at + 1].clone()
        };
        assert_eq!(pair("--proto"), "=https");
        assert_eq!(pair("--proto-redir"), "=https");
        assert_eq!(pair("--max-time"), "15");
        assert_eq!(pair("--max-filesize"), (MAX_CONFIG_CHARS * 4).to_string());
        assert_eq!(
            pair("--"),
            "https://huggingface.co/a/b/resolve/main/config.json"
        );
        for credential in [
            "-u", "--user", "-n", "--netrc", "-H", "--header", "-b", "--cookie",
        ] {
            assert!(!args.iter().any(|a| a == credential), "{credential}");
        }
    }

    #[test]
    fn commits() {
        assert!(is_commit("607a30d783dfa663caf39e06633721c8d4cfcd7e"));
        for not in [
            "main",
            "607a30d783dfa663caf39e06633721c8d4cfcd7",
            "607A30D783DFA663CAF39E06633721C8D4CFCD7E",
            "607a30d783dfa663caf39e06633721c8d4cfcd7g",
        ] {
            assert!(!is_commit(not), "{not}");
        }
    }
}
