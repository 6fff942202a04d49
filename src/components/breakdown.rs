//! The breakdown card: where the memory of one step goes.

use crate::effect::memo;
use estimator_core::{format_bytes, group_thousands, ByteUnit};
use leptos::prelude::*;

use crate::markup::{children, Markup};

/// One line of the breakdown.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BreakdownPart {
    /// `data-testid` of the line (`weights`, `gradients`, ...).
    pub testid: &'static str,
    /// What the bytes are, for a person.
    pub label: &'static str,
    /// Exact byte count.
    pub bytes: u64,
    /// What the bytes are made of (listed below the line), summing to `bytes`; may be empty.
    pub details: Vec<BreakdownDetail>,
}

/// One item of a line's sub-list: what part of the line's bytes is for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BreakdownDetail {
    /// Key of the item; its figure's `data-testid` is `saved-part-{key}`.
    pub key: &'static str,
    /// What the bytes are for, for a person.
    pub label: &'static str,
    /// Exact byte count.
    pub bytes: u64,
}

/// Share of `part` in `total`, in tenths of a percent, with integer arithmetic.
fn per_mille(part: u64, total: u64) -> u64 {
    if total == 0 {
        return 0;
    }
    let share = u128::from(part) * 1000 / u128::from(total);
    u64::try_from(share).unwrap_or(1000)
}

/// A share in tenths of a percent as `12.3%`.
fn percent(per_mille: u64) -> String {
    format!("{}.{}%", per_mille / 10, per_mille % 10)
}

/// The exact count for a figure's tooltip: `1,234 bytes`.
fn exact(bytes: u64) -> String {
    format!("{} bytes", group_thousands(bytes))
}

/// The total (`total_label` and the figure), or why there is none, and beside it what the
/// caching allocator reserves at that peak (`max_memory_reserved`) when it is known.
pub fn total_markup(
    total: Option<u64>,
    reserved: Option<u64>,
    problem: Option<&str>,
    unit: ByteUnit,
    total_label: &str,
) -> String {
    let mut m = Markup::default();
    match total {
        Some(bytes) => {
            m.open("p", &[("class", "total")])
                .el("span", &[("class", "total-label")], total_label)
                .el(
                    "strong",
                    &[
                        ("data-testid", "total"),
                        ("data-bytes", &bytes.to_string()),
                        ("title", &exact(bytes)),
                    ],
                    &format_bytes(bytes, unit),
                );
            if let Some(reserved) = reserved {
                m.open("span", &[("class", "reserved")])
                    .text(" allocated · ")
                    .el(
                        "strong",
                        &[
                            ("data-testid", "reserved"),
                            ("data-bytes", &reserved.to_string()),
                            ("title", &exact(reserved)),
                        ],
                        &format_bytes(reserved, unit),
                    )
                    .text(" reserved by PyTorch's caching allocator")
                    .close("span");
            }
            m.close("p");
        }
        None => {
            m.el(
                "p",
                &[("class", "total unavailable"), ("data-testid", "total")],
                problem.unwrap_or("Fix the highlighted fields to see the figures."),
            );
        }
    }
    m.finish()
}

/// The bar's segments, one string per part (none: no bar).
pub fn bar_markup(parts: &[BreakdownPart], total: Option<u64>) -> Vec<String> {
    let mut m = Markup::default();
    let Some(total) = total else {
        return Vec::new();
    };
    let mut offset = 0u64;
    for p in parts {
        let share = per_mille(p.bytes, total);
        let x = offset;
        offset += share;
        m.open(
            "rect",
            &[
                ("class", &format!("bar-part part-{}", p.testid)),
                ("x", &x.to_string()),
                ("y", "0"),
                ("width", &share.to_string()),
                ("height", "10"),
            ],
        )
        .el("title", &[], &format!("{}: {}", p.label, percent(share)))
        .close("rect");
    }
    m.pieces()
}

/// The lines of the breakdown, each with its share of `total` and its sub-list, one string
/// per line.
pub fn rows_markup(parts: &[BreakdownPart], total: Option<u64>, unit: ByteUnit) -> Vec<String> {
    let mut m = Markup::default();
    for p in parts {
        let share = total.map_or(0, |t| per_mille(p.bytes, t));
        m.open("div", &[("class", "row")])
            .open("dt", &[])
            .el(
                "span",
                &[("class", &format!("swatch part-{}", p.testid))],
                "",
            )
            .text(p.label)
            .close("dt")
            .open(
                "dd",
                &[
                    ("data-testid", p.testid),
                    ("data-bytes", &p.bytes.to_string()),
                    ("title", &exact(p.bytes)),
                ],
            )
            .text(&format_bytes(p.bytes, unit))
            .el("span", &[("class", "share")], &percent(share))
            .close("dd");
        if !p.details.is_empty() {
            m.open("dd", &[("class", "details")])
                .open("ul", &[("data-testid", &format!("{}-details", p.testid))]);
            for d in &p.details {
                m.open("li", &[])
                    .el("span", &[], d.label)
                    .el(
                        "span",
                        &[
                            ("data-testid", &format!("saved-part-{}", d.key)),
                            ("data-bytes", &d.bytes.to_string()),
                            ("title", &exact(d.bytes)),
                        ],
                        &format_bytes(d.bytes, unit),
                    )
                    .close("li");
            }
            m.close("ul").close("dd");
        }
        m.close("div");
    }
    m.pieces()
}

/// The breakdown card around its markups: the total ([`total_markup`]), the bar's segments
/// ([`bar_markup`], none for no bar) and the lines ([`rows_markup`]).
pub fn breakdown_card(
    total: Memo<String>,
    bar: Memo<Vec<String>>,
    rows: Memo<Vec<String>>,
) -> impl IntoView {
    view! {
        <section class="card breakdown" aria-labelledby="breakdown-title">
            <h2 id="breakdown-title">"Memory for one training step"</h2>
            <div aria-live="polite" aria-atomic="true" data-testid="breakdown" inner_html=total></div>
            // An SVG bar: its geometry is attributes, not inline styles, so the page needs no
            // 'unsafe-inline' in its Content-Security-Policy (hidden while it has no segments).
            <svg class="bar" viewBox="0 0 1000 10" preserveAspectRatio="none" aria-hidden="true"
                data-testid="breakdown-bar" use:children=bar></svg>
            <dl class="parts" use:children=rows></dl>
        </section>
    }
}

/// The figures of one step with a bar of each part's share of the total.
///
/// Each figure carries its exact byte count in `data-bytes`; the unit switch changes only
/// what a person reads.
#[component]
pub fn BreakdownCard(
    /// The parts, or `None` while an input is invalid.
    #[prop(into)]
    parts: Signal<Option<Vec<BreakdownPart>>>,
    /// The total (the peak of the step), or `None` while an input is invalid.
    #[prop(into)]
    total: Signal<Option<u64>>,
    /// Why there is no figure, when there is none.
    #[prop(into)]
    problem: Signal<Option<String>>,
    /// The unit figures are shown in.
    #[prop(into)]
    unit: Signal<ByteUnit>,
    /// What the total means (`Total`, `Peak`).
    #[prop(into)]
    total_label: Signal<&'static str>,
) -> impl IntoView {
    let figure = memo(move |_| {
        problem.with(|problem| {
            total_markup(
                total.get(),
                None,
                problem.as_deref(),
                unit.get(),
                total_label.get(),
            )
        })
    });
    let bar = memo(move |_| {
        parts.with(|parts| {
            parts
                .as_deref()
                .map(|parts| bar_markup(parts, total.get()))
                .unwrap_or_default()
        })
    });
    let rows = memo(move |_| {
        parts.with(|parts| {
            rows_markup(
                parts.as_deref().unwrap_or_default(),
                total.get(),
                unit.get(),
            )
        })
    });
    breakdown_card(figure, bar, rows)
}
