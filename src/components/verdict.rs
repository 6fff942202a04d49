//! Will it fit: the verdict, the largest batch and the accumulation plan.

use crate::effect::memo;
use estimator_core::{
    format_bytes, group_thousands, ByteUnit, Evaluation, LongestSequence, MaxBatch,
};
use leptos::prelude::*;

use crate::markup::{children, Markup};

/// The verdict's markup, one string per paragraph or list: fits or not, by how much, what the need adds up, the largest batch,
/// the longest sequence (once searched: `longest`, with the link that opens the page at
/// it) and the accumulation plan (`None`: the inputs are invalid).
pub fn verdict_markup(
    e: Option<&Evaluation>,
    unit: ByteUnit,
    longest: Option<(&LongestSequence, &str)>,
) -> Vec<String> {
    let mut m = Markup::default();
    verdict_into(&mut m, e, unit, longest);
    m.pieces()
}

/// The longest sequence that fits at the batch shown, its length a link to the page at it.
fn longest_into(m: &mut Markup, l: &LongestSequence, link: &str, per_gpu: &str) {
    let batch = l.batch.to_string();
    let what = if l.prompt.is_some() {
        "completion"
    } else {
        "sequence"
    };
    let tokens = l.tokens.unwrap_or(0).to_string();
    m.open(
        "p",
        &[
            ("data-testid", "longest-seq"),
            ("data-tokens", &tokens),
            ("data-batch", &batch),
        ],
    );
    match l.tokens {
        Some(t) => {
            m.text("Longest ")
                .text(what)
                .text(" that fits at batch ")
                .text(&batch)
                .text(per_gpu);
            if let Some(p) = l.prompt {
                m.text(" (after the ")
                    .text(&group_thousands(p))
                    .text("-token prompt)");
            }
            m.text(": ")
                .open("strong", &[])
                .el(
                    "a",
                    &[("data-testid", "longest-seq-link"), ("href", link)],
                    &format!("{} tokens", group_thousands(t)),
                )
                .close("strong");
            if l.at_model_limit() {
                m.text(" (the most positions the model takes)");
            }
            m.text(".");
        }
        None => {
            m.text("No ")
                .text(what)
                .text(" of ")
                .text(&l.step.to_string())
                .text(" tokens fits at batch ")
                .text(&batch)
                .text(per_gpu)
                .text(".");
        }
    }
    m.close("p");
}

fn verdict_into(
    m: &mut Markup,
    e: Option<&Evaluation>,
    unit: ByteUnit,
    longest: Option<(&LongestSequence, &str)>,
) {
    let Some(e) = e else {
        m.el(
            "p",
            &[("data-testid", "fit-verdict")],
            "Waiting for valid inputs.",
        );
        return;
    };
    let Some(v) = &e.verdict else {
        m.el(
            "p",
            &[("data-testid", "fit-verdict")],
            "Choose a GPU to see whether the step fits.",
        );
        return;
    };
    let fits = v.fits();
    m.open(
        "p",
        &[
            (
                "class",
                if fits {
                    "verdict fits"
                } else {
                    "verdict no-fit"
                },
            ),
            ("data-testid", "fit-verdict"),
            ("data-fits", if fits { "true" } else { "false" }),
        ],
    )
    .el("strong", &[], &e.verdict_text(unit).unwrap_or_default())
    .close("p");
    // What the verdict adds up: `(label, data-testid, bytes, a sum)`.
    m.open("dl", &[("class", "parts overhead-lines")]);
    for (label, testid, bytes, sum) in [
        (
            "Peak of the step (tensors: max_memory_allocated)",
            "need-peak",
            v.peak_bytes,
            false,
        ),
        (
            match (
                e.allocator.is_some(),
                e.plan.overheads.outside_allocator_bytes > 0,
            ) {
                (true, false) => "Caching allocator's reserve beyond it (the step replayed)",
                (true, true) => "Caching allocator's reserve beyond it (the step replayed; none on memory outside the allocator)",
                (false, false) => "Allocator reserve (the percentage set)",
                (false, true) => "Allocator reserve (the percentage set, of the memory in the allocator)",
            },
            "need-reserve",
            v.allocator_reserve_bytes,
            false,
        ),
        ("CUDA context", "need-context", v.cuda_context_bytes, false),
        (
            "NCCL buffers (one communicator per group)",
            "need-communication",
            v.communication_bytes,
            false,
        ),
        ("Needed", "need-total", v.needed_bytes, true),
        (
            "GPU capacity",
            "gpu-capacity-bytes",
            v.capacity_bytes,
            false,
        ),
        (
            "Safety margin held back",
            "margin-held",
            v.safety_margin_bytes,
            false,
        ),
        ("Usable", "usable", v.usable_bytes, true),
    ] {
        // NCCL's line only where there is communication
        if testid == "need-communication" && bytes == 0 {
            continue;
        }
        m.open("div", &[("class", if sum { "row sum" } else { "row" })])
            .el("dt", &[], label)
            .el(
                "dd",
                &[("data-testid", testid), ("data-bytes", &bytes.to_string())],
                &format_bytes(bytes, unit),
            )
            .close("div");
    }
    m.close("dl");
    // beside the verdict: the host RAM what is offloaded takes
    if e.step.host_bytes > 0 {
        m.open("p", &[])
            .text("Host RAM for what is offloaded: ")
            .el(
                "strong",
                &[
                    ("data-testid", "host-ram"),
                    ("data-bytes", &e.step.host_bytes.to_string()),
                ],
                &format_bytes(e.step.host_bytes, unit),
            )
            .text(" per GPU (times the GPUs of a node for the node's RAM)")
            .close("p");
    }
    let per_gpu = if e.per_gpu { " per GPU" } else { "" };
    match e.max_batch {
        Some(MaxBatch::Fits(b)) => {
            let b = b.to_string();
            m.open("p", &[])
                .text("Largest batch that fits")
                .text(per_gpu)
                .text(": ")
                .el(
                    "strong",
                    &[("data-testid", "max-batch"), ("data-value", &b)],
                    &b,
                )
                .close("p");
        }
        Some(MaxBatch::NoneFits(_)) => {
            m.el(
                "p",
                &[("data-testid", "max-batch"), ("data-value", "0")],
                &e.nothing_fits_text(unit).unwrap_or_default(),
            );
        }
        None => {}
    }
    if let Some((l, link)) = longest {
        longest_into(m, l, link, per_gpu);
    }
    // the step shown: the typed batch, in as many passes as the global batch needs
    let passes = e.plan.micro_batches_at(e.batch);
    if passes > 1 && e.step.trainable_params > 0 {
        m.el(
            "p",
            &[
                ("data-testid", "accumulation-passes"),
                ("data-passes", &passes.to_string()),
            ],
            &format!(
                "These figures are a batch of {} per GPU in {passes} accumulation passes: from \
                 the second pass on, every gradient stays alive through the forward and the \
                 backward (added into, freed by the optimizer step).",
                e.batch
            ),
        );
    }
    if let Some(p) = e.accumulation {
        let reached = p.global_batch();
        let target = e.plan.global_batch.unwrap_or(reached);
        let overshoot = if reached > target {
            format!(" ({reached} samples: the nearest whole split above {target})")
        } else {
            String::new()
        };
        m.el(
                "p",
                &[
                    ("data-testid", "accumulation-plan"),
                    ("data-micro-batch", &p.micro_batch.to_string()),
                    ("data-steps", &p.accumulation_steps.to_string()),
                    ("data-gpus", &p.num_gpus.to_string()),
                ],
                &format!(
                    "Global batch {target}: micro-batch {} per GPU × {} accumulation step{} × {} GPU{}{overshoot}. \
                     Each optimizer step then runs {} forward and backward pass{} per GPU.",
                    p.micro_batch,
                    p.accumulation_steps,
                    if p.accumulation_steps == 1 { "" } else { "s" },
                    p.num_gpus,
                    if p.num_gpus == 1 { "" } else { "s" },
                    p.accumulation_steps,
                    if p.accumulation_steps == 1 { "" } else { "es" },
                ),
            );
    }
}

/// The verdict card around its markup ([`verdict_markup`]).
pub fn verdict_card(body: Memo<Vec<String>>) -> impl IntoView {
    view! {
        <section class="card verdict-card" aria-labelledby="verdict-title">
            <h2 id="verdict-title">"Will it fit?"</h2>
            <div aria-live="polite" use:children=body></div>
        </section>
    }
}

/// The answer for the chosen GPU: fits or not, by how much, the largest batch that fits,
/// and micro-batch x accumulation x GPUs for the global batch.
#[component]
pub fn VerdictCard(
    /// The evaluation, when the inputs are valid.
    #[prop(into)]
    evaluation: Signal<Option<Evaluation>>,
    /// The unit figures are shown in.
    #[prop(into)]
    unit: Signal<ByteUnit>,
) -> impl IntoView {
    verdict_card(memo(move |_| {
        evaluation.with(|e| verdict_markup(e.as_ref(), unit.get(), None))
    }))
}
