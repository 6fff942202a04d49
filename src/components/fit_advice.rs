//! What to change so that it fits: the advisor's plans, each a link to the page with them.

use crate::effect::memo;
use estimator_core::{encode_query, format_bytes, ByteUnit, FitPlan, MaxBatch};
use leptos::prelude::*;

use crate::markup::Markup;

/// The markup of the advisor's plans (or of why there are none), figures in `unit`: what
/// the page shows under "What to change so that it fits", made where the search ran (the
/// advisor's worker, or the page itself).
#[must_use]
pub fn plans_markup(plans: &Result<Vec<FitPlan>, String>, unit: ByteUnit) -> String {
    let mut m = Markup::default();
    match plans {
        Err(why) => {
            m.el("p", &[("class", "hint")], why);
        }
        Ok(plans) if plans.is_empty() => {
            m.el(
                "p",
                &[("data-testid", "fit-advice-none")],
                "Nothing the advisor tries fits this device: not 64 times the GPUs with ZeRO-3, \
                 nor lower precision, a lighter optimizer, QLoRA or a sixteenth of the sequence. \
                 Choose a device with more memory.",
            );
        }
        Ok(plans) => {
            // the plans on the person's GPUs, then those on more: a list under a
            // heading each, numbered on
            for (i, p) in plans.iter().enumerate() {
                if i == 0 || plans[i - 1].rank.more_gpus != p.rank.more_gpus {
                    if i > 0 {
                        m.close("ol");
                    }
                    m.el(
                        "h3",
                        &[
                            ("class", "plan-group"),
                            ("data-testid", "plan-group"),
                            ("data-more-gpus", if p.rank.more_gpus { "1" } else { "0" }),
                        ],
                        &p.group_heading(),
                    )
                    .open("ol", &[("class", "plans"), ("start", &(i + 1).to_string())]);
                }
                let mut what = if p.changes.is_empty() {
                    "As it is: it fits.".to_owned()
                } else {
                    p.changes
                        .iter()
                        .map(|c| c.label())
                        .collect::<Vec<_>>()
                        .join(" · ")
                };
                if p.rank.more_gpus {
                    what = format!("{} GPUs: {what}", p.rank.gpus);
                }
                let largest = match p.max_batch {
                    MaxBatch::Fits(b) => format!("largest batch {b}"),
                    MaxBatch::NoneFits(_) => String::new(),
                };
                let tier = p.rank.tier.label();
                m.open(
                    "li",
                    &[
                        ("data-testid", "fit-plan"),
                        ("data-tier", tier),
                        ("data-gpus", &p.rank.gpus.to_string()),
                        ("data-peak-bytes", &p.peak_bytes.to_string()),
                    ],
                )
                .el("span", &[("class", "tier")], tier)
                .el(
                    "a",
                    &[("href", &format!("?{}", encode_query(&p.state)))],
                    &what,
                )
                .el(
                    "span",
                    &[("class", "plan-figures")],
                    &format!(
                        " — peak {} at batch {}, {largest}",
                        format_bytes(p.peak_bytes, unit),
                        p.batch
                    ),
                )
                .open("ul", &[("class", "costs")]);
                for c in &p.changes {
                    m.el("li", &[], &c.cost());
                }
                m.close("ul").close("li");
            }
            m.close("ol");
        }
    }
    m.finish()
}

/// The plans that fit, best first: what changes, what it costs, the peak at its batch and
/// the largest batch, each a link that opens the page with those settings.
#[component]
pub fn FitAdvice(
    /// The plans' markup ([`plans_markup`]); `None` while the inputs are invalid or no device
    /// is chosen.
    plans: RwSignal<Option<String>>,
    /// Whether the step fits as it is (the list is then shown on request).
    fits_now: Memo<bool>,
    /// Whether a person asked for the plans although the step fits.
    show: RwSignal<bool>,
) -> impl IntoView {
    let no_plans = memo(move |_| plans.with(Option::is_none));
    let fits_not = memo(move |_| !fits_now.get());
    let list = memo(move |_| {
        if fits_now.get() && !show.get() {
            return String::new();
        }
        plans.get().unwrap_or_default()
    });
    view! {
        <section class="card fit-advice" aria-labelledby="advice-title" data-testid="fit-advice"
            hidden=no_plans>
            <h2 id="advice-title">"What to change so that it fits"</h2>
            <div hidden=fits_not>
                <label class="inline-check">
                    <input type="checkbox" data-testid="show-plans"
                        prop:checked=move || show.get()
                        on:change=move |ev| show.set(event_target_checked(&ev)) />
                    " It fits as it is. Show other plans too"
                </label>
            </div>
            <p class="hint">
                "Plans on the GPUs you have first, then on more. Each group is ranked by what you give up: "
                "the same math first (checkpointing, micro-batches with accumulation, sharding), then "
                "precision, the optimizer, LoRA, QLoRA, and last the sequence length. Each link opens "
                "the page with that plan."
            </p>
            <div aria-live="polite" inner_html=list></div>
        </section>
    }
}
