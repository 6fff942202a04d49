//! Will it fit: the verdict, the largest batch and the accumulation plan.

use estimator_core::{format_bytes, ByteUnit, Evaluation, MaxBatch};
use leptos::prelude::*;

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
    let body = move || {
        let unit = unit.get();
        let Some(e) = evaluation.get() else {
            return view! { <p data-testid="fit-verdict">"Waiting for valid inputs."</p> }
                .into_any();
        };
        let Some(v) = e.verdict else {
            return view! { <p data-testid="fit-verdict">"Choose a GPU to see whether the step fits."</p> }.into_any();
        };
        let per_gpu = if e.per_gpu { " per GPU" } else { "" };
        let verdict = e.verdict_text(unit).unwrap_or_default();
        let max_batch = match e.max_batch {
            Some(MaxBatch::Fits(b)) => view! {
                <p>
                    "Largest batch that fits" {per_gpu} ": "
                    <strong data-testid="max-batch" data-value=b.to_string()>{b.to_string()}</strong>
                </p>
            }
            .into_any(),
            Some(MaxBatch::NoneFits(_)) => view! {
                <p data-testid="max-batch" data-value="0">{e.nothing_fits_text(unit)}</p>
            }
            .into_any(),
            None => ().into_any(),
        };
        let accumulation = e.accumulation.map(|p| {
            let reached = p.global_batch();
            let target = e.plan.global_batch.unwrap_or(reached);
            let overshoot = if reached > target {
                format!(" ({reached} samples: the nearest whole split above {target})")
            } else {
                String::new()
            };
            view! {
                <p data-testid="accumulation-plan"
                   data-micro-batch=p.micro_batch.to_string()
                   data-steps=p.accumulation_steps.to_string()
                   data-gpus=p.num_gpus.to_string()>
                    {format!(
                        "Global batch {target}: micro-batch {} per GPU × {} accumulation step{} × {} GPU{}{overshoot}. \
                         Each optimizer step then runs {} forward and backward pass{} per GPU.",
                        p.micro_batch,
                        p.accumulation_steps,
                        if p.accumulation_steps == 1 { "" } else { "s" },
                        p.num_gpus,
                        if p.num_gpus == 1 { "" } else { "s" },
                        p.accumulation_steps,
                        if p.accumulation_steps == 1 { "" } else { "es" },
                    )}
                </p>
            }
        });
        // What the verdict adds up: `(label, data-testid, bytes, a sum)`.
        let lines = [
            ("Peak of the step (tensors)", "need-peak", v.peak_bytes, false),
            ("Allocator reserve", "need-reserve", v.allocator_reserve_bytes, false),
            ("CUDA context", "need-context", v.cuda_context_bytes, false),
            ("Needed", "need-total", v.needed_bytes, true),
            ("GPU capacity", "gpu-capacity-bytes", v.capacity_bytes, false),
            ("Safety margin held back", "margin-held", v.safety_margin_bytes, false),
            ("Usable", "usable", v.usable_bytes, true),
        ]
        .map(|(label, testid, bytes, sum)| {
            view! {
                <div class="row" class:sum=sum>
                    <dt>{label}</dt>
                    <dd data-testid=testid data-bytes=bytes.to_string()>{format_bytes(bytes, unit)}</dd>
                </div>
            }
        });
        view! {
            <p class="verdict" class:fits=v.fits() class:no-fit=!v.fits() data-testid="fit-verdict"
               data-fits=if v.fits() { "true" } else { "false" }>
                <strong>{verdict}</strong>
            </p>
            <dl class="parts overhead-lines">{lines}</dl>
            {max_batch}
            {accumulation}
        }
        .into_any()
    };
    view! {
        <section class="card verdict-card" aria-labelledby="verdict-title">
            <h2 id="verdict-title">"Will it fit?"</h2>
            <div aria-live="polite">{body}</div>
        </section>
    }
}
