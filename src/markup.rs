//! Read-only results written as markup: each card's figures are one string, set as the
//! `innerHTML` of an element the view keeps.
//!
//! The figures change on every keystroke and hold no focus, listener or state of their own,
//! so a card is cheaper written as text (one DOM call, parsed by the browser) than diffed
//! node by node and attribute by attribute, and a string builder is much smaller in
//! WebAssembly than a view tree per card. Every text and attribute value is escaped.

/// A string of HTML (or SVG) built element by element.
#[derive(Default)]
pub struct Markup(String);

impl Markup {
    /// `<tag name="value" ...>`; the values are escaped, an empty name is left out (an
    /// attribute that is there only sometimes).
    pub fn open(&mut self, tag: &str, attrs: &[(&str, &str)]) -> &mut Self {
        self.0.push('<');
        self.0.push_str(tag);
        for &(name, value) in attrs {
            if !name.is_empty() {
                self.0.push(' ');
                self.0.push_str(name);
                self.0.push_str("=\"");
                self.escape(value);
                self.0.push('"');
            }
        }
        self.0.push('>');
        self
    }

    /// `</tag>`.
    pub fn close(&mut self, tag: &str) -> &mut Self {
        self.0.push_str("</");
        self.0.push_str(tag);
        self.0.push('>');
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
        self.0
    }

    fn escape(&mut self, text: &str) {
        for c in text.chars() {
            match c {
                '&' => self.0.push_str("&amp;"),
                '<' => self.0.push_str("&lt;"),
                '>' => self.0.push_str("&gt;"),
                '"' => self.0.push_str("&quot;"),
                c => self.0.push(c),
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
