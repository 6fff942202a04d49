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

/// `name` when `on`, else nothing: an attribute or class that is there only sometimes.
#[must_use]
pub const fn when(on: bool, name: &'static str) -> &'static str {
    if on {
        name
    } else {
        ""
    }
}

/// A directive, `use:children=markup`: keeps the element's children those of `markup` (one
/// string per child element, from [`Markup::pieces`]), parsing again only the children whose
/// markup changed; all of them at once when their number changes or most of them changed
/// (one parse of the whole is cheaper than one per child).
pub fn children(el: web_sys::Element, markup: Memo<Vec<String>>) {
    let mut shown: Vec<String> = Vec::new();
    watch(move || {
        markup.with(|pieces| {
            // each piece compared once (the pieces are kilobytes of markup)
            let same_count = pieces.len() == shown.len();
            let changed: Vec<bool> = if same_count {
                shown
                    .iter()
                    .zip(pieces)
                    .map(|(was, now)| was != now)
                    .collect()
            } else {
                Vec::new()
            };
            let few = changed.iter().filter(|&&c| c).count() * 2 <= pieces.len();
            if same_count && few {
                let mut child = el.first_element_child();
                for (&differs, now) in changed.iter().zip(pieces) {
                    let Some(current) = child else { break };
                    child = current.next_element_sibling();
                    if differs {
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
