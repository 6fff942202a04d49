//! Read-only results written as markup: each card's figures are one string, set as the
//! `innerHTML` of an element the view keeps.
//!
//! The figures change on every keystroke and hold no focus, listener or state of their own,
//! so a card is cheaper written as text (one DOM call, parsed by the browser) than diffed
//! node by node and attribute by attribute, and a string builder is much smaller in
//! WebAssembly than a view tree per card. Every text and attribute value is escaped. A card
//! that changes in parts keeps its markup as one string per child element, and only the
//! children whose markup changed are parsed again ([`children`]).

use leptos::prelude::*;

use crate::effect::watch;

/// A string of HTML (or SVG) built element by element.
#[derive(Default)]
pub struct Markup {
    html: String,
    /// How many elements are open.
    depth: usize,
    /// Where each top-level element ends.
    ends: Vec<usize>,
}

impl Markup {
    /// `<tag name="value" ...>`; the values are escaped, an empty name is left out (an
    /// attribute that is there only sometimes).
    pub fn open(&mut self, tag: &str, attrs: &[(&str, &str)]) -> &mut Self {
        self.depth += 1;
        self.html.push('<');
        self.html.push_str(tag);
        for &(name, value) in attrs {
            if !name.is_empty() {
                self.html.push(' ');
                self.html.push_str(name);
                self.html.push_str("=\"");
                self.escape(value);
                self.html.push('"');
            }
        }
        self.html.push('>');
        self
    }

    /// `</tag>`.
    pub fn close(&mut self, tag: &str) -> &mut Self {
        self.html.push_str("</");
        self.html.push_str(tag);
        self.html.push('>');
        self.depth = self.depth.saturating_sub(1);
        if self.depth == 0 {
            self.ends.push(self.html.len());
        }
        self
    }

    /// Text, escaped.
    pub fn text(&mut self, text: &str) -> &mut Self {
        self.escape(text);
        self
    }

    /// `<tag ...>text</tag>`.
    pub fn el(&mut self, tag: &str, attrs: &[(&str, &str)], text: &str) -> &mut Self {
        self.open(tag, attrs).text(text).close(tag)
    }

    /// The markup built.
    #[must_use]
    pub fn finish(self) -> String {
        self.html
    }

    /// The markup built, one string per top-level element (for [`children`]; every element
    /// must be closed, and text belongs to the element after it).
    #[must_use]
    pub fn pieces(self) -> Vec<String> {
        let mut start = 0;
        self.ends
            .iter()
            .map(|&end| {
                // (`get`, not indexing: a str slice's panic path pulls the char Debug
                // formatter and its Unicode tables into the bundle; every end is a boundary)
                let piece = self.html.get(start..end).unwrap_or_default().to_owned();
                start = end;
                piece
            })
            .collect()
    }

    fn escape(&mut self, text: &str) {
        for c in text.chars() {
            match c {
                '&' => self.html.push_str("&amp;"),
                '<' => self.html.push_str("&lt;"),
                '>' => self.html.push_str("&gt;"),
                '"' => self.html.push_str("&quot;"),
                c => self.html.push(c),
            }
        }
    }
}

/// `text` as markup (escaped), for an element whose text changes: set as its `innerHTML`
/// like the cards' figures, where a reactive text node (`{move || ...}` in a view) compiles a
/// view type of its own (the page's five headings and button texts cost 1.6 KB gzipped so).
#[must_use]
pub fn text_markup(text: &str) -> String {
    let mut m = Markup::default();
    m.text(text);
    m.finish()
}

/// `name` when `on`, else nothing: an attribute or class that is there only sometimes.
#[must_use]
pub const fn when(on: bool, name: &'static str) -> &'static str {
    if on {
        name
    } else {
        ""
    }
}

/// One token of the markup [`Markup`] writes: `<tag attributes>`, text, or `</tag>`.
#[derive(Clone, Copy, PartialEq)]
enum Token<'a> {
    /// The tag's name and its attributes as written (` name="value"` each).
    Open(&'a str, &'a str),
    Text(&'a str),
    Close,
}

/// Where the next `byte` is in `text` from `from` on (its end when there is none).
fn find(text: &str, from: usize, byte: u8) -> usize {
    let bytes = text.as_bytes();
    bytes
        .get(from..)
        .and_then(|rest| rest.iter().position(|&b| b == byte))
        .map_or(bytes.len(), |at| from + at)
}

/// `markup` cut into tokens (markup this module wrote: values escaped, no comments). Byte
/// by byte: every delimiter is ASCII, and a character searcher would cost more than the
/// patching it serves.
fn tokens(markup: &str) -> Vec<Token<'_>> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < markup.len() {
        if markup.as_bytes().get(at) == Some(&b'<') {
            let end = find(markup, at, b'>');
            let inner = markup.get(at + 1..end).unwrap_or_default();
            out.push(if inner.starts_with('/') {
                Token::Close
            } else {
                let space = find(inner, 0, b' ');
                Token::Open(
                    inner.get(..space).unwrap_or_default(),
                    inner.get(space..).unwrap_or_default(),
                )
            });
            at = end + 1;
        } else {
            let end = find(markup, at, b'<');
            out.push(Token::Text(markup.get(at..end).unwrap_or_default()));
            at = end;
        }
    }
    out
}

/// The ` name="value"` pairs of an opening tag's attributes (the value still escaped).
fn attributes(written: &str) -> impl Iterator<Item = (&str, &str)> {
    let mut at = 0;
    std::iter::from_fn(move || {
        let equals = find(written, at, b'=');
        let name = written.get(at..equals)?.get(1..)?;
        let end = find(written, equals + 2, b'"');
        let value = written.get(equals + 2..end)?;
        at = end + 1;
        Some((name, value))
    })
}

/// The text that [`Markup::escape`] wrote as `text`. (Written out: `str::replace` would
/// bring a substring searcher into the bundle.)
fn unescape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        rest = rest.get(c.len_utf8()..).unwrap_or_default();
        if c == '&' {
            if let Some((entity, plain)) =
                [("amp;", '&'), ("lt;", '<'), ("gt;", '>'), ("quot;", '"')]
                    .into_iter()
                    .find(|(entity, _)| rest.starts_with(entity))
            {
                rest = rest.get(entity.len()..).unwrap_or_default();
                out.push(plain);
                continue;
            }
        }
        out.push(c);
    }
    out
}

/// Whether markup `now` differs from `was` only in attribute values and in texts that open
/// their element (its first child node): then [`patch`] can bring the element shown from
/// one to the other.
fn patchable(was: &[Token<'_>], now: &[Token<'_>]) -> bool {
    was.len() == now.len()
        && was.iter().zip(now).enumerate().all(|(i, pair)| match pair {
            (Token::Open(a, x), Token::Open(b, y)) => {
                a == b
                    && attributes(x)
                        .map(|(n, _)| n)
                        .eq(attributes(y).map(|(n, _)| n))
            }
            // a text right after its element's opening tag is its first child node
            (Token::Text(x), Token::Text(y)) => {
                x == y || (i > 0 && matches!(now.get(i - 1), Some(Token::Open(..))))
            }
            (Token::Close, Token::Close) => true,
            _ => false,
        })
}

/// Brings `root`, shown from markup `was`, to markup `now` by setting the attributes and
/// texts that differ ([`patchable`] ones): a few DOM calls instead of the parse of the whole
/// element. Descends only into elements with a difference. False when the elements shown do
/// not follow the markup (then the caller writes it anew).
fn patch(root: &web_sys::Element, was: &[Token<'_>], now: &[Token<'_>]) -> bool {
    // where each element's markup ends, and whether anything in it differs
    let mut end = vec![0; now.len()];
    let mut dirty = vec![false; now.len()];
    let mut open: Vec<usize> = Vec::new();
    for (i, (a, b)) in was.iter().zip(now).enumerate() {
        match b {
            Token::Open(..) => {
                open.push(i);
                dirty[i] = a != b;
            }
            Token::Text(_) => {
                if let (true, Some(&parent)) = (a != b, open.last()) {
                    dirty[parent] = true;
                }
            }
            Token::Close => {
                let Some(start) = open.pop() else {
                    return false;
                };
                end[start] = i;
                if let (true, Some(&parent)) = (dirty[start], open.last()) {
                    dirty[parent] = true;
                }
            }
        }
    }
    if !open.is_empty() {
        return false;
    }
    let mut stack: Vec<web_sys::Element> = Vec::new();
    let mut next = Some(root.clone());
    let mut i = 0;
    while let (Some(a), Some(b)) = (was.get(i), now.get(i)) {
        match (a, b) {
            (Token::Open(_, x), Token::Open(_, y)) => {
                let Some(element) = next.take() else {
                    return false;
                };
                if !dirty[i] {
                    next = element.next_element_sibling();
                    i = end[i] + 1;
                    continue;
                }
                for ((_, old), (name, value)) in attributes(x).zip(attributes(y)) {
                    if old != value && element.set_attribute(name, &unescape(value)).is_err() {
                        return false;
                    }
                }
                next = element.first_element_child();
                stack.push(element);
            }
            (Token::Text(x), Token::Text(y)) => {
                if x != y {
                    let Some(text) = stack.last().and_then(|e| e.first_child()) else {
                        return false;
                    };
                    text.set_node_value(Some(&unescape(y)));
                }
            }
            _ => {
                let Some(element) = stack.pop() else {
                    return false;
                };
                next = element.next_element_sibling();
            }
        }
        i += 1;
    }
    stack.is_empty()
}

/// A changed child: its markup shown and its markup now, as tokens, and whether the one can
/// be patched into the other.
type Change<'a> = (Vec<Token<'a>>, Vec<Token<'a>>, bool);

/// A directive, `use:children=markup`: keeps the element's children those of `markup` (one
/// string per child element, from [`Markup::pieces`]). A child whose markup changed only in
/// attribute values and texts is patched in place ([`patch`]); one that changed otherwise
/// is parsed again; all of them at once when their number changes or most of them must be
/// parsed (one parse of the whole is cheaper than one per child).
pub fn children(el: web_sys::Element, markup: Memo<Vec<String>>) {
    let mut shown: Vec<String> = Vec::new();
    watch(move || {
        markup.with(|pieces| {
            // each piece compared once (the pieces are kilobytes of markup) and cut into
            // tokens once; None: unchanged
            let same_count = pieces.len() == shown.len();
            let changed: Vec<Option<Change<'_>>> = if same_count {
                shown
                    .iter()
                    .zip(pieces)
                    .map(|(was, now)| {
                        (was != now).then(|| {
                            let (was, now) = (tokens(was), tokens(now));
                            let patchable = patchable(&was, &now);
                            (was, now, patchable)
                        })
                    })
                    .collect()
            } else {
                Vec::new()
            };
            let parsed = changed
                .iter()
                .filter(|c| c.as_ref().is_some_and(|(_, _, patchable)| !patchable))
                .count();
            if same_count && parsed * 2 <= pieces.len() {
                let mut child = el.first_element_child();
                for (change, now) in changed.iter().zip(pieces) {
                    let Some(current) = child else { break };
                    child = current.next_element_sibling();
                    let patched = match change {
                        None => true,
                        Some((was, tokens, true)) => patch(&current, was, tokens),
                        Some((_, _, false)) => false,
                    };
                    if !patched {
                        current.set_outer_html(now);
                    }
                }
            } else {
                el.set_inner_html(&pieces.concat());
            }
            shown.clone_from(pieces);
        });
    });
}
