//! The breakdown card: where the memory of one step goes.

use estimator_core::{format_bytes, group_thousands, ByteUnit};
use leptos::prelude::*;

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
    let bar = move || {
        let (Some(parts), Some(total)) = (parts.get(), total.get()) else {
            return ().into_any();
        };
        // An SVG bar: its geometry is attributes, not inline styles, so the page needs no
        // 'unsafe-inline' in its Content-Security-Policy.
        let mut offset = 0u64;
        let segments = parts
            .into_iter()
            .map(|p| {
                let share = per_mille(p.bytes, total);
                let x = offset;
                offset += share;
                view! {
                    <rect class=format!("bar-part part-{}", p.testid) x=x y="0" width=share height="10">
                        <title>{format!("{}: {}.{}%", p.label, share / 10, share % 10)}</title>
                    </rect>
                }
            })
            .collect_view();
        view! {
            <svg class="bar" viewBox="0 0 1000 10" preserveAspectRatio="none" aria-hidden="true" data-testid="breakdown-bar">
                {segments}
            </svg>
        }
        .into_any()
    };
    let rows = move || {
        let unit = unit.get();
        let total_bytes = total.get();
        parts
            .get()
            .unwrap_or_default()
            .into_iter()
            .map(|p| {
                let share = total_bytes.map(|t| per_mille(p.bytes, t)).unwrap_or(0);
                let details = (!p.details.is_empty()).then(|| {
                    let items = p
                        .details
                        .into_iter()
                        .map(|d| {
                            view! {
                                <li>
                                    <span>{d.label}</span>
                                    <span
                                        data-testid=format!("saved-part-{}", d.key)
                                        data-bytes=d.bytes.to_string()
                                        title=format!("{} bytes", group_thousands(d.bytes))
                                    >
                                        {format_bytes(d.bytes, unit)}
                                    </span>
                                </li>
                            }
                        })
                        .collect_view();
                    view! {
                        <dd class="details">
                            <ul data-testid=format!("{}-details", p.testid)>{items}</ul>
                        </dd>
                    }
                });
                view! {
                    <div class="row">
                        <dt>
                            <span class=format!("swatch part-{}", p.testid)></span>
                            {p.label}
                        </dt>
                        <dd
                            data-testid=p.testid
                            data-bytes=p.bytes.to_string()
                            title=format!("{} bytes", group_thousands(p.bytes))
                        >
                            {format_bytes(p.bytes, unit)}
                            <span class="share">{format!("{}.{}%", share / 10, share % 10)}</span>
                        </dd>
                        {details}
                    </div>
                }
            })
            .collect_view()
    };
    view! {
        <section class="card breakdown" aria-labelledby="breakdown-title">
            <h2 id="breakdown-title">"Memory for one training step"</h2>
            <div aria-live="polite" aria-atomic="true" data-testid="breakdown">
                {move || match (total.get(), problem.get()) {
                    (Some(bytes), _) => {
                        view! {
                            <p class="total">
                                <span class="total-label">{move || total_label.get()}</span>
                                <strong
                                    data-testid="total"
                                    data-bytes=bytes.to_string()
                                    title=format!("{} bytes", group_thousands(bytes))
                                >
                                    {move || format_bytes(bytes, unit.get())}
                                </strong>
                            </p>
                        }
                            .into_any()
                    }
                    (None, problem) => {
                        view! {
                            <p class="total unavailable" data-testid="total">
                                {problem.unwrap_or_else(|| "Fix the highlighted fields to see the figures.".to_owned())}
                            </p>
                        }
                            .into_any()
                    }
                }}
            </div>
            {bar}
            <dl class="parts">{rows}</dl>
        </section>
    }
}
