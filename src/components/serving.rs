//! Serving with vLLM: the KV cache its start-up sizes, the requests it holds, where the
//! device's memory goes, the concurrency at other lengths and what to change when one
//! request does not fit.

use estimator_core::{
    encode_query, format_bytes, group_thousands, vllm_gib, ByteUnit, Field, PageState, ServeChange,
    Serving,
};
use leptos::prelude::*;

use crate::components::CopyButton;
use crate::effect::memo;
use crate::markup::Markup;

/// The serving card's markup (empty when serving is off): the headline figures, the
/// budget's parts, the sweep over lengths and the changes that let vLLM start.
pub fn serving_markup(
    serving: Option<&Result<Serving, (Field, String)>>,
    advice: &[(ServeChange, PageState)],
    unit: ByteUnit,
) -> String {
    let mut m = Markup::default();
    match serving {
        None => {}
        Some(Err((field, why))) => {
            m.el(
                "p",
                &[
                    ("class", "error"),
                    ("data-testid", "serve-error"),
                    ("role", "alert"),
                ],
                &format!("{}: {why}", field.label()),
            );
        }
        Some(Ok(s)) => {
            headline(&mut m, s);
            parts(&mut m, s, unit);
            sweep(&mut m, s);
            changes(&mut m, advice);
        }
    }
    m.finish()
}

fn headline(m: &mut Markup, s: &Serving) {
    m.open("p", &[("class", "serve-headline")])
        .el(
            "strong",
            &[
                ("data-testid", "serve-kv-tokens"),
                ("data-value", &s.kv_cache_tokens.to_string()),
            ],
            &format!("{} tokens", group_thousands(s.kv_cache_tokens)),
        )
        .text(" of KV cache per GPU (GPU KV cache size), ")
        .el(
            "strong",
            &[
                ("data-testid", "serve-concurrency"),
                ("data-value", &s.max_concurrency.hundredths().to_string()),
            ],
            &s.max_concurrency.to_string(),
        )
        .text(" requests of ")
        .text(&group_thousands(s.max_model_len))
        .text(" tokens at once (Maximum concurrency). The longest max_model_len one request can have: ")
        .el(
            "strong",
            &[
                ("data-testid", "serve-longest"),
                ("data-value", &s.largest_max_model_len.to_string()),
            ],
            &format!("{} tokens", group_thousands(s.largest_max_model_len)),
        )
        .text(".")
        .close("p");
    let refusal = if s.available_kv_bytes <= 0 {
        Some(
            "vLLM refuses to start: the weights and the profile leave no memory for the KV cache."
                .to_owned(),
        )
    } else if !s.max_model_len_fits {
        Some(format!(
            "vLLM refuses to start: one request of {} tokens does not fit in the KV cache (at most {}).",
            group_thousands(s.max_model_len),
            group_thousands(s.largest_max_model_len)
        ))
    } else {
        None
    };
    if let Some(why) = refusal {
        m.el(
            "p",
            &[("class", "no-fit"), ("data-testid", "serve-verdict")],
            &why,
        );
    }
    if !s.graphs_fit() {
        m.el(
            "p",
            &[("class", "no-fit"), ("data-testid", "serve-graphs-warning")],
            "CUDA graphs, captured after the sizing, may not fit in what gpu_memory_utilization leaves: lower it, or run with enforce_eager.",
        );
    }
}

/// One line of the budget: its bytes, and as vLLM logs them (GiB) when `logged`.
fn part(m: &mut Markup, key: &str, label: &str, bytes: u64, unit: ByteUnit, logged: bool) {
    m.open(
        "tr",
        &[("data-testid", key), ("data-bytes", &bytes.to_string())],
    )
    .el("th", &[("scope", "row")], label)
    .open("td", &[])
    .text(&format_bytes(bytes, unit));
    if logged {
        m.text(" (").text(&vllm_gib(bytes)).text(" GiB)");
    }
    m.close("td").close("tr");
}

fn parts(m: &mut Markup, s: &Serving, unit: ByteUnit) {
    let available = u64::try_from(s.available_kv_bytes).unwrap_or(0);
    m.open("table", &[("class", "serve-parts")]);
    for (key, label, bytes, logged) in [
        (
            "serve-total",
            "Device total (as the driver reports it)",
            s.device_total_bytes,
            false,
        ),
        (
            "serve-requested",
            "gpu_memory_utilization of it",
            s.requested_bytes,
            false,
        ),
        (
            "serve-weights",
            "Weights (Model loading took)",
            s.weights_bytes,
            true,
        ),
        (
            "serve-activation",
            "Profile peak (forward and sampler)",
            s.activation_bytes,
            false,
        ),
        ("serve-non-torch", "Outside torch", s.non_torch_bytes, false),
        (
            "serve-kv-cache",
            "KV cache (Available KV cache memory)",
            available,
            true,
        ),
        (
            "serve-headroom",
            "Left by gpu_memory_utilization",
            s.headroom_bytes,
            false,
        ),
        (
            "serve-cuda-graphs",
            "CUDA graphs, in that headroom (about)",
            s.cuda_graph_bytes,
            false,
        ),
    ] {
        part(m, key, label, bytes, unit, logged);
    }
    m.close("table");
}

fn sweep(m: &mut Markup, s: &Serving) {
    m.open(
        "table",
        &[("class", "serve-sweep"), ("data-testid", "serve-sweep")],
    )
    .open("tr", &[])
    .el("th", &[("scope", "col")], "max_model_len")
    .el("th", &[("scope", "col")], "Maximum concurrency")
    .close("tr");
    for r in &s.sweep {
        m.open(
            "tr",
            &[
                ("data-len", &r.max_model_len.to_string()),
                ("class", if r.fits { "fits" } else { "no-fit" }),
            ],
        )
        .el("td", &[], &group_thousands(r.max_model_len))
        .el(
            "td",
            &[],
            &if r.fits {
                r.max_concurrency.to_string()
            } else {
                "does not start".to_owned()
            },
        )
        .close("tr");
    }
    m.close("table");
}

fn changes(m: &mut Markup, advice: &[(ServeChange, PageState)]) {
    if advice.is_empty() {
        return;
    }
    m.el("p", &[], "What lets vLLM start:")
        .open("ul", &[("data-testid", "serve-advice")]);
    for (a, changed) in advice {
        m.open("li", &[])
            .open("a", &[("href", &format!("?{}", encode_query(changed)))])
            .text(a.label);
        if a.value > 0 {
            m.text(" ").text(&group_thousands(a.value));
        }
        m.close("a")
            .text(": ")
            .text(&group_thousands(a.serving.kv_cache_tokens))
            .text(" tokens, ")
            .text(&a.serving.max_concurrency.to_string())
            .close("li");
    }
    m.close("ul");
}

/// The sweep as tab-separated values, for the copy button.
pub fn serving_tsv(serving: Option<&Result<Serving, (Field, String)>>) -> String {
    let mut out = String::from("max_model_len\tmax_concurrency\tstarts\n");
    if let Some(Ok(s)) = serving {
        for r in &s.sweep {
            let h = r.max_concurrency.hundredths();
            out.push_str(&format!(
                "{}\t{}.{:02}\t{}\n",
                r.max_model_len,
                h / 100,
                h % 100,
                if r.fits { "yes" } else { "no" }
            ));
        }
    }
    out
}

/// The serving card around its markup ([`serving_markup`]); hidden while serving is off.
pub fn serving_card(body: Memo<String>, tsv: Memo<String>) -> impl IntoView {
    let hidden = memo(move |_| body.with(String::is_empty));
    view! {
        <section class="card serving-card" data-testid="serving-card" aria-labelledby="serving-title"
            hidden=hidden>
            <h2 id="serving-title">"Serve with vLLM (v0.11.0's start-up, per GPU)"</h2>
            <div aria-live="polite" inner_html=body></div>
            <CopyButton label="Copy the sweep (TSV)" testid="copy-serve-tsv" text=tsv />
        </section>
    }
}
