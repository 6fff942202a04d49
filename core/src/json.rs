//! A small JSON reader and writer for `config.json` files.
//!
//! The estimator only reads configs and writes their compact form, so it needs a value tree,
//! not a serialization framework: this replaces `serde_json` in the core and keeps the web
//! bundle smaller. Numbers keep their source text, so a compact form written back prints them
//! exactly as they were read (no float printer, no rounding).

use std::fmt::{self, Write as _};

/// An object: keys sorted, as `serde_json`'s default map writes them (a sorted list: configs
/// have tens of keys, and a tree map's code is several KB of the bundle).
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Map(Vec<(String, Value)>);

impl Map {
    #[must_use]
    pub fn new() -> Self {
        Map(Vec::new())
    }

    fn position(&self, key: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(k, _)| k.as_str().cmp(key))
    }

    #[must_use]
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.position(key).ok().map(|i| &self.0[i].1)
    }

    /// Sets `key` (a repeated key keeps its last value, as in `serde_json`).
    pub fn insert(&mut self, key: String, value: Value) {
        match self.position(&key) {
            Ok(i) => self.0[i].1 = value,
            Err(i) => self.0.insert(i, (key, value)),
        }
    }

    fn iter(&self) -> impl Iterator<Item = &(String, Value)> {
        self.0.iter()
    }
}

/// What the vision-language readers do to a wrapper's `text_config` (fill its class's
/// defaults, drop the vision side of a flat config).
#[cfg(feature = "vision")]
impl Map {
    /// Whether `key` is set.
    #[must_use]
    pub fn contains_key(&self, key: &str) -> bool {
        self.position(key).is_ok()
    }

    /// Removes `key`, if set.
    pub fn remove(&mut self, key: &str) {
        if let Ok(i) = self.position(key) {
            self.0.remove(i);
        }
    }
}

impl<const N: usize> From<[(String, Value); N]> for Map {
    fn from(pairs: [(String, Value); N]) -> Self {
        let mut map = Map::new();
        for (k, v) in pairs {
            map.insert(k, v);
        }
        map
    }
}

/// Nesting deeper than this is refused instead of overflowing the stack.
const MAX_DEPTH: usize = 128;

/// One JSON value.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Value {
    Null,
    Bool(bool),
    /// A number, as written in the source (validated against JSON's grammar).
    Number(Box<str>),
    String(String),
    Array(Vec<Value>),
    Object(Map),
}

impl Value {
    /// The number as an unsigned integer, when it is written as one (`8`, not `8.0`).
    #[must_use]
    pub fn as_u64(&self) -> Option<u64> {
        match self {
            Value::Number(text) => crate::number::parse_u64(text),
            _ => None,
        }
    }

    /// The number as a float (exact for the decimals configs hold; close for the rest).
    #[must_use]
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Number(text) => Some(decimal_to_f64(text)),
            _ => None,
        }
    }

    #[must_use]
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    #[must_use]
    pub fn as_object(&self) -> Option<&Map> {
        match self {
            Value::Object(m) => Some(m),
            _ => None,
        }
    }
}

#[cfg(feature = "vision")]
impl From<u64> for Value {
    fn from(n: u64) -> Self {
        Value::Number(n.to_string().into_boxed_str())
    }
}

impl From<&str> for Value {
    fn from(s: &str) -> Self {
        Value::String(s.to_owned())
    }
}

/// A validated JSON number's text as a float: the digits as an integer, scaled by a power of
/// ten (exactly rounded while both fit in 53 bits and 10^22, which covers every config value).
fn decimal_to_f64(text: &str) -> f64 {
    let (negative, rest) = match text.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, text),
    };
    // (not sliced at an index: see `number::parse_decimal`)
    let (mantissa_text, exp_text) = rest.split_once(['e', 'E']).unwrap_or((rest, "0"));
    let mut exponent: i64 = crate::number::parse_i64(exp_text.trim_start_matches('+'))
        .unwrap_or(0)
        .clamp(-1000, 1000);
    let mut digits: u64 = 0;
    let mut seen_point = false;
    for c in mantissa_text.chars() {
        if c == '.' {
            seen_point = true;
            continue;
        }
        let d = u64::from(c as u8 - b'0');
        if digits < (1 << 60) / 10 {
            digits = digits * 10 + d;
            if seen_point {
                exponent -= 1;
            }
        } else if !seen_point {
            exponent += 1;
        }
    }
    #[allow(clippy::cast_precision_loss)]
    let mut value = digits as f64;
    let exponent = i32::try_from(exponent).unwrap_or(0);
    if exponent >= 0 {
        value *= 10f64.powi(exponent);
    } else if exponent >= -300 {
        value /= 10f64.powi(-exponent);
    } else {
        value = 0.0;
    }
    if negative {
        -value
    } else {
        value
    }
}

/// Why a text is not JSON, with the line and column where reading stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ParseError {
    what: &'static str,
    line: usize,
    column: usize,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} at line {} column {}",
            self.what, self.line, self.column
        )
    }
}

/// Parses one JSON document (whitespace around it allowed, nothing else).
pub(crate) fn parse(text: &str) -> Result<Value, ParseError> {
    let mut p = Parser {
        text,
        bytes: text.as_bytes(),
        pos: 0,
    };
    p.skip_ws();
    let v = p.value(0)?;
    p.skip_ws();
    if p.pos < p.bytes.len() {
        return Err(p.error("trailing characters"));
    }
    Ok(v)
}

struct Parser<'a> {
    text: &'a str,
    bytes: &'a [u8],
    pos: usize,
}

impl Parser<'_> {
    fn error(&self, what: &'static str) -> ParseError {
        let upto = &self.bytes[..self.pos.min(self.bytes.len())];
        let line = upto.iter().filter(|&&b| b == b'\n').count() + 1;
        let column = upto.iter().rev().take_while(|&&b| b != b'\n').count() + 1;
        ParseError { what, line, column }
    }

    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.pos).copied()
    }

    fn skip_ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.pos += 1;
        }
    }

    fn expect_word(&mut self, word: &[u8], v: Value) -> Result<Value, ParseError> {
        if self.bytes[self.pos..].starts_with(word) {
            self.pos += word.len();
            Ok(v)
        } else {
            Err(self.error("expected value"))
        }
    }

    fn value(&mut self, depth: usize) -> Result<Value, ParseError> {
        if depth > MAX_DEPTH {
            return Err(self.error("recursion limit exceeded"));
        }
        match self.peek() {
            None => Err(self.error("EOF while parsing a value")),
            Some(b'n') => self.expect_word(b"null", Value::Null),
            Some(b't') => self.expect_word(b"true", Value::Bool(true)),
            Some(b'f') => self.expect_word(b"false", Value::Bool(false)),
            Some(b'"') => self.string().map(Value::String),
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(b'[') => {
                self.pos += 1;
                let mut items = Vec::new();
                self.skip_ws();
                if self.peek() == Some(b']') {
                    self.pos += 1;
                    return Ok(Value::Array(items));
                }
                loop {
                    self.skip_ws();
                    items.push(self.value(depth + 1)?);
                    self.skip_ws();
                    match self.peek() {
                        Some(b',') => self.pos += 1,
                        Some(b']') => {
                            self.pos += 1;
                            return Ok(Value::Array(items));
                        }
                        None => return Err(self.error("EOF while parsing a list")),
                        Some(_) => return Err(self.error("expected `,` or `]`")),
                    }
                }
            }
            Some(b'{') => {
                self.pos += 1;
                let mut map = Map::new();
                self.skip_ws();
                if self.peek() == Some(b'}') {
                    self.pos += 1;
                    return Ok(Value::Object(map));
                }
                loop {
                    self.skip_ws();
                    if self.peek() != Some(b'"') {
                        return Err(self.error("key must be a string"));
                    }
                    let key = self.string()?;
                    self.skip_ws();
                    if self.peek() != Some(b':') {
                        return Err(self.error("expected `:`"));
                    }
                    self.pos += 1;
                    self.skip_ws();
                    let v = self.value(depth + 1)?;
                    map.insert(key, v);
                    self.skip_ws();
                    match self.peek() {
                        Some(b',') => self.pos += 1,
                        Some(b'}') => {
                            self.pos += 1;
                            return Ok(Value::Object(map));
                        }
                        None => return Err(self.error("EOF while parsing an object")),
                        Some(_) => return Err(self.error("expected `,` or `}`")),
                    }
                }
            }
            Some(_) => Err(self.error("expected value")),
        }
    }

    fn digits(&mut self) -> usize {
        let start = self.pos;
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.pos += 1;
        }
        self.pos - start
    }

    fn number(&mut self) -> Result<Value, ParseError> {
        let start = self.pos;
        if self.peek() == Some(b'-') {
            self.pos += 1;
        }
        let leading_zero = self.peek() == Some(b'0');
        let n = self.digits();
        if n == 0 || (leading_zero && n > 1) {
            return Err(self.error("invalid number"));
        }
        if self.peek() == Some(b'.') {
            self.pos += 1;
            if self.digits() == 0 {
                return Err(self.error("invalid number"));
            }
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.pos += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.pos += 1;
            }
            if self.digits() == 0 {
                return Err(self.error("invalid number"));
            }
        }
        // The run is ASCII digits and signs, so its ends are character boundaries.
        let text = self.text.get(start..self.pos).unwrap_or("0");
        Ok(Value::Number(text.into()))
    }

    fn hex4(&mut self) -> Result<u32, ParseError> {
        let mut v = 0;
        for _ in 0..4 {
            let d = match self.peek() {
                Some(c @ b'0'..=b'9') => c - b'0',
                Some(c @ b'a'..=b'f') => c - b'a' + 10,
                Some(c @ b'A'..=b'F') => c - b'A' + 10,
                _ => return Err(self.error("invalid escape")),
            };
            v = v * 16 + u32::from(d);
            self.pos += 1;
        }
        Ok(v)
    }

    fn string(&mut self) -> Result<String, ParseError> {
        self.pos += 1; // the opening quote
        let mut out = String::new();
        loop {
            let run_start = self.pos;
            while let Some(c) = self.peek() {
                if c == b'"' || c == b'\\' || c < 0x20 {
                    break;
                }
                self.pos += 1;
            }
            // Runs end before ASCII bytes only, so they are whole UTF-8 characters.
            out.push_str(self.text.get(run_start..self.pos).unwrap_or(""));
            match self.peek() {
                None => return Err(self.error("EOF while parsing a string")),
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(out);
                }
                Some(b'\\') => {
                    self.pos += 1;
                    let escaped = self.peek();
                    self.pos += 1;
                    let c = match escaped {
                        Some(b'"') => '"',
                        Some(b'\\') => '\\',
                        Some(b'/') => '/',
                        Some(b'b') => '\u{8}',
                        Some(b'f') => '\u{c}',
                        Some(b'n') => '\n',
                        Some(b'r') => '\r',
                        Some(b't') => '\t',
                        Some(b'u') => {
                            let mut code = self.hex4()?;
                            if (0xD800..0xDC00).contains(&code)
                                && self.bytes[self.pos..].starts_with(b"\\u")
                            {
                                self.pos += 2;
                                let low = self.hex4()?;
                                if !(0xDC00..0xE000).contains(&low) {
                                    return Err(self.error("invalid unicode escape"));
                                }
                                code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
                            }
                            char::from_u32(code)
                                .ok_or_else(|| self.error("invalid unicode escape"))?
                        }
                        _ => return Err(self.error("invalid escape")),
                    };
                    out.push(c);
                }
                Some(_) => return Err(self.error("control character in a string")),
            }
        }
    }
}

/// Writes the value as compact JSON (no spaces), strings escaped as `serde_json` does.
impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Null => f.write_str("null"),
            Value::Bool(b) => f.write_str(if *b { "true" } else { "false" }),
            Value::Number(text) => f.write_str(text),
            Value::String(s) => write_string(f, s),
            Value::Array(items) => {
                f.write_str("[")?;
                for (i, v) in items.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    v.fmt(f)?;
                }
                f.write_str("]")
            }
            Value::Object(map) => {
                f.write_str("{")?;
                for (i, (k, v)) in map.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write_string(f, k)?;
                    f.write_str(":")?;
                    v.fmt(f)?;
                }
                f.write_str("}")
            }
        }
    }
}

fn write_string(f: &mut fmt::Formatter<'_>, s: &str) -> fmt::Result {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    f.write_str("\"")?;
    for c in s.chars() {
        match c {
            '"' => f.write_str("\\\"")?,
            '\\' => f.write_str("\\\\")?,
            '\n' => f.write_str("\\n")?,
            '\r' => f.write_str("\\r")?,
            '\t' => f.write_str("\\t")?,
            '\u{8}' => f.write_str("\\b")?,
            '\u{c}' => f.write_str("\\f")?,
            c if (c as u32) < 0x20 => {
                let b = c as usize;
                f.write_str("\\u00")?;
                f.write_char(char::from(HEX[b >> 4]))?;
                f.write_char(char::from(HEX[b & 0xf]))?;
            }
            c => {
                let mut buf = [0u8; 4];
                f.write_str(c.encode_utf8(&mut buf))?;
            }
        }
    }
    f.write_str("\"")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn round_trip(text: &str, compact: &str) {
        let v = parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(v.to_string(), compact);
        assert_eq!(parse(compact).as_ref(), Ok(&v));
    }

    #[track_caller]
    fn refused(text: &str, what: &str) {
        let e = parse(text).expect_err(text);
        assert!(e.to_string().starts_with(what), "{text}: {e}");
    }

    #[test]
    fn values_round_trip_in_compact_form_with_sorted_keys() {
        round_trip(
            " { \"b\" : [1, 2.50, -3e-05, true, false, null], \"a\": {} } ",
            "{\"a\":{},\"b\":[1,2.50,-3e-05,true,false,null]}",
        );
        round_trip(
            "\"\\u00e9\\ud83d\\ude00 \\\" \\\\ \\n \\u0001\"",
            "\"é😀 \\\" \\\\ \\n \\u0001\"",
        );
        round_trip("[]", "[]");
        round_trip("\"Ünïcode\"", "\"Ünïcode\"");
    }

    #[test]
    fn numbers_read_as_configs_need_them() {
        let n = |t: &str| parse(t).unwrap();
        assert_eq!(n("4096").as_u64(), Some(4096));
        assert_eq!(n("8.0").as_u64(), None);
        assert_eq!(n("-1").as_u64(), None);
        assert_eq!(n("18446744073709551616").as_u64(), None);
        assert_eq!(n("0.75").as_f64(), Some(0.75));
        assert_eq!(n("0.1").as_f64(), Some(0.1));
        assert_eq!(n("1e-05").as_f64(), Some(1e-5));
        assert_eq!(n("500000.0").as_f64(), Some(500_000.0));
        assert_eq!(n("-2.5E+2").as_f64(), Some(-250.0));
        assert_eq!(n("1e400").as_f64(), Some(f64::INFINITY));
        assert_eq!(n("1e-400").as_f64(), Some(0.0));
    }

    #[test]
    fn malformed_text_is_refused_with_its_position() {
        refused(
            "{\"a\": 1",
            "EOF while parsing an object at line 1 column 8",
        );
        refused("{\"a\":\n  01}", "invalid number at line 2 column 5");
        refused("[1,]", "expected value");
        refused("{1: 2}", "key must be a string");
        refused("\"a\u{1}\"", "control character");
        refused("nul", "expected value");
        refused("1 2", "trailing characters");
        refused("\"\\ud800\\u0041\"", "invalid unicode escape");
        refused("-", "invalid number");
        refused("1.", "invalid number");
        refused("", "EOF while parsing a value");
        refused(&"[".repeat(200), "recursion limit exceeded");
    }
}
