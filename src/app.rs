//! The page: the inputs as one signal, the figures as memos over the core crate.

use estimator_core::{
    decode_query, encode_query, format_bytes, parse_activation_mb, parse_batch, parse_params,
    simple_breakdown, simple_breakdown_at_batch, sweep, ByteUnit, Decoded, Optimizer, PageState,
    ParamUnit, Precision, SweepRow, MAX_BATCH, SIMPLE_OPTIMIZERS,
};
use leptos::prelude::*;

use crate::browser;
use crate::components::{
    BreakdownCard, BreakdownPart, Explanations, Notices, NumberField, SelectField, SweepTable,
};

/// The inputs the page opens with: the URL's if it has any, else the saved ones, else the
/// defaults; with a notice for every part that could not be used.
fn initial_state() -> Decoded {
    let query = browser::current_query();
    if !query.is_empty() {
        return decode_query(&query);
    }
    match browser::load_stored() {
        Ok(Some(stored)) => {
            let mut decoded = decode_query(&stored);
            for notice in &mut decoded.notices {
                *notice = format!("Saved inputs: {notice}");
            }
            decoded
        }
        Ok(None) => Decoded::default(),
        Err(why) => Decoded {
            notices: vec![why],
            ..Decoded::default()
        },
    }
}

/// The whole estimator page.
#[component]
pub fn App() -> impl IntoView {
    let Decoded { state, notices } = initial_state();
    let state = RwSignal::new(state);
    let notices = RwSignal::new(notices);

    let unit = Memo::new(move |_| state.with(|s| s.byte_unit));
    let params_error = Memo::new(move |_| {
        state.with(|s| {
            parse_params(&s.params, s.params_unit)
                .err()
                .map(|e| e.to_string())
        })
    });
    let batch_error =
        Memo::new(move |_| state.with(|s| parse_batch(&s.batch).err().map(|e| e.to_string())));
    let activation_error = Memo::new(move |_| {
        state.with(|s| {
            parse_activation_mb(&s.activation_mb)
                .err()
                .map(|e| e.to_string())
        })
    });
    let inputs = Memo::new(move |_| state.with(|s| s.simple_inputs().ok()));
    let breakdown = Memo::new(move |_| inputs.get().map(|i| simple_breakdown(&i)));
    let sweep_rows = Memo::new(move |_| -> Vec<SweepRow> {
        let Some(inputs) = inputs.get() else {
            return Vec::new();
        };
        sweep(inputs.batch, MAX_BATCH, |batch| {
            simple_breakdown_at_batch(&inputs, batch).map(|b| SweepRow {
                batch,
                model_state_bytes: b.model_state_bytes(),
                activation_bytes: b.activations,
                total_bytes: b.total,
                is_selected: false,
                fits: None,
            })
        })
    });

    let parts = Signal::derive(move || {
        breakdown.get().and_then(Result::ok).map(|b| {
            vec![
                BreakdownPart {
                    testid: "weights",
                    label: "Weights",
                    bytes: b.weights,
                },
                BreakdownPart {
                    testid: "gradients",
                    label: "Gradients",
                    bytes: b.gradients,
                },
                BreakdownPart {
                    testid: "optimizer-states",
                    label: "Optimizer states",
                    bytes: b.optimizer_states,
                },
                BreakdownPart {
                    testid: "activations",
                    label: "Activations",
                    bytes: b.activations,
                },
            ]
        })
    });
    let total = Signal::derive(move || breakdown.get().and_then(Result::ok).map(|b| b.total));
    let problem = Signal::derive(move || match breakdown.get() {
        Some(Err(too_large)) => Some(too_large.to_string()),
        _ => None,
    });

    // The URL and storage follow the inputs; history is replaced so Back leaves the page.
    Effect::new(move |_| {
        let query = state.with(encode_query);
        browser::replace_query(&query);
        browser::store(&query);
    });
    Effect::new(move |_| {
        let title = match total.get() {
            Some(bytes) => format!(
                "{} · Batch Size Memory Estimator",
                format_bytes(bytes, unit.get())
            ),
            None => "Batch Size Memory Estimator".to_owned(),
        };
        browser::set_title(&title);
    });

    let set = move |apply: fn(&mut PageState, String)| {
        Callback::new(move |value: String| state.update(|s| apply(s, value)))
    };

    view! {
        <header class="page-header">
            <h1>"Batch Size Memory Estimator"</h1>
            <p class="lede">
                "How much GPU memory one training step needs, where it goes, and which batch size fits."
            </p>
        </header>
        <Notices notices=notices />
        <main class="layout">
            <form class="card inputs" aria-labelledby="inputs-title" on:submit=|ev| ev.prevent_default()>
                <h2 id="inputs-title">"Model and training step"</h2>
                <div class="field-row">
                    <NumberField
                        label="Model parameters"
                        testid="params"
                        hint="Decimals allowed: 0.5 with B is 500 million."
                        value=Signal::derive(move || state.with(|s| s.params.clone()))
                        on_input=set(|s, v| s.params = v)
                        error=params_error
                    />
                    <SelectField
                        label="Unit"
                        testid="params-unit"
                        options=ParamUnit::ALL.iter().map(|u| (u.key(), u.label())).collect()
                        value=Signal::derive(move || state.with(|s| s.params_unit.key()))
                        on_change=set(|s, v| {
                            if let Some(u) = ParamUnit::from_key(&v) {
                                s.params_unit = u;
                            }
                        })
                    />
                </div>
                <SelectField
                    label="Numerical precision"
                    testid="precision"
                    options=Precision::ALL.iter().map(|p| (p.key(), p.label())).collect()
                    value=Signal::derive(move || state.with(|s| s.precision.key()))
                    on_change=set(|s, v| {
                        if let Some(p) = Precision::from_key(&v) {
                            s.precision = p;
                        }
                    })
                />
                <SelectField
                    label="Optimizer"
                    testid="optimizer"
                    options=SIMPLE_OPTIMIZERS.iter().map(|o| (o.key(), o.label())).collect()
                    value=Signal::derive(move || state.with(|s| s.optimizer.key()))
                    on_change=set(|s, v| {
                        if let Some(o) = Optimizer::from_key(&v) {
                            s.optimizer = o;
                        }
                    })
                />
                <NumberField
                    label="Batch size"
                    testid="batch"
                    hint="Samples per step, a whole number."
                    value=Signal::derive(move || state.with(|s| s.batch.clone()))
                    on_input=set(|s, v| s.batch = v)
                    error=batch_error
                />
                <NumberField
                    label="Activation memory per sample (MB)"
                    testid="act-mb"
                    hint="Intermediate tensors one sample keeps for backward, in MB (10⁶ bytes)."
                    value=Signal::derive(move || state.with(|s| s.activation_mb.clone()))
                    on_input=set(|s, v| s.activation_mb = v)
                    error=activation_error
                />
                <fieldset class="unit-switch" data-testid="unit">
                    <legend>"Show figures in"</legend>
                    {ByteUnit::ALL
                        .into_iter()
                        .map(|u| {
                            let id = match u {
                                ByteUnit::Gb => "unit-gb",
                                ByteUnit::Gib => "unit-gib",
                            };
                            view! {
                                <label class="radio" for=id>
                                    <input
                                        type="radio"
                                        name="unit"
                                        id=id
                                        data-testid=id
                                        value=u.key()
                                        prop:checked=move || unit.get() == u
                                        on:change=move |_| state.update(|s| s.byte_unit = u)
                                    />
                                    {match u {
                                        ByteUnit::Gb => "GB (10⁹ bytes)",
                                        ByteUnit::Gib => "GiB (2³⁰ bytes)",
                                    }}
                                </label>
                            }
                        })
                        .collect_view()}
                </fieldset>
            </form>
            <div class="results">
                <BreakdownCard
                    parts=parts
                    total=total
                    problem=problem
                    unit=unit
                    total_label=Signal::derive(|| "Total")
                />
                <SweepTable rows=sweep_rows unit=unit total_label=Signal::derive(|| "Total") />
            </div>
        </main>
        <Explanations />
        <footer class="page-footer">
            <p>"Runs entirely in your browser: nothing you type leaves this page."</p>
        </footer>
    }
}
