//! The breakdown card: where the memory of one step goes.

use estimator_core::{format_bytes, group_thousands, ByteUnit};
use leptos::prelude::*;

use crate::markup::Markup;

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
    let has_bar = Memo::new(move |_| total.with(Option::is_some) && parts.with(Option::is_some));
    let segments = move || {
        let mut m = Markup::default();
        let total = total.get().unwrap_or(0);
        let mut offset = 0u64;
        parts.with(|parts| {
            for p in parts.iter().flatten() {
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
        });
        m.finish()
    };
    let rows = move || {
        let unit = unit.get();
        let total_bytes = total.get();
        let mut m = Markup::default();
        parts.with(|parts| {
            for p in parts.iter().flatten() {
                let share = total_bytes.map_or(0, |t| per_mille(p.bytes, t));
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
        });
        m.finish()
    };
    let figure = move || {
        let mut m = Markup::default();
        match total.get() {
            Some(bytes) => {
                m.open("p", &[("class", "total")])
                    .el("span", &[("class", "total-label")], total_label.get())
                    .el(
                        "strong",
                        &[
                            ("data-testid", "total"),
                            ("data-bytes", &bytes.to_string()),
                            ("title", &exact(bytes)),
                        ],
                        &format_bytes(bytes, unit.get()),
                    )
                    .close("p");
            }
            None => {
                let problem = problem.get();
                m.el(
                    "p",
                    &[("class", "total unavailable"), ("data-testid", "total")],
                    problem
                        .as_deref()
                        .unwrap_or("Fix the highlighted fields to see the figures."),
                );
            }
        }
        m.finish()
    };
    view! {
        <section class="card breakdown" aria-labelledby="breakdown-title">
            <h2 id="breakdown-title">"Memory for one training step"</h2>
            <div aria-live="polite" aria-atomic="true" data-testid="breakdown" inner_html=figure></div>
            // An SVG bar: its geometry is attributes, not inline styles, so the page needs no
            // 'unsafe-inline' in its Content-Security-Policy.
            {move || has_bar.get().then(|| view! {
                <svg class="bar" viewBox="0 0 1000 10" preserveAspectRatio="none" aria-hidden="true"
                    data-testid="breakdown-bar" inner_html=segments></svg>
            })}
            <dl class="parts" inner_html=rows></dl>
        </section>
    }
}
