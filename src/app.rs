//! The page: the inputs as one signal, everything shown as memos over the core crate.

use estimator_core::{
    decode_query, encode_query, format_bytes, group_thousands, largest_peak_that_fits, parse_page,
    AttentionKernel, ByteUnit, Checkpointing, Decoded, Evaluation, Field, FitPlan, Gpu, KvDtype,
    LossKind, Method, Mode, ModelFamily, Optimizer, ParamUnit, PartKind, PipelineSchedule,
    Precision, PrecisionRecipe, Preset, Quant4, Scenario, Sharding, SweepRow, Trainer,
    WeightFormat, CUSTOM_MODEL_KEY, SIMPLE_OPTIMIZERS,
};
use leptos::prelude::*;

use crate::browser;
use crate::components::{
    BreakdownCard, BreakdownDetail, BreakdownPart, ConfigInput, Explanations, FitAdvice,
    MemoryChart, ModelNotes, Notices, NumberField, OptionGroup, RadioGroup, SelectField,
    SweepTable, VerdictCard,
};
use crate::markup::{when, Markup};

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

/// `(key, label)` pairs of a choice enum, for a [`SelectField`].
fn options<T: Copy>(
    all: &[T],
    key: fn(T) -> &'static str,
    label: fn(T) -> &'static str,
) -> Vec<(&'static str, &'static str)> {
    all.iter().map(|&v| (key(v), label(v))).collect()
}

/// The trainers, then "Custom" for settings that are no trainer's defaults.
fn trainer_options() -> Vec<(&'static str, &'static str)> {
    let mut all = options(&Trainer::ALL, Trainer::key, Trainer::label);
    all.push(("custom", "Custom (defaults changed below)"));
    all
}

/// The presets under one heading per family, in the order of [`Preset::ALL`].
fn preset_groups() -> Vec<OptionGroup> {
    let mut groups: Vec<(ModelFamily, OptionGroup)> = Vec::new();
    for preset in Preset::ALL {
        let family = preset.family();
        let option = (preset.key(), preset.label());
        match groups.iter_mut().find(|(f, _)| *f == family) {
            Some((_, (_, options))) => options.push(option),
            None => groups.push((family, (family.label(), vec![option]))),
        }
    }
    groups.into_iter().map(|(_, group)| group).collect()
}

/// How long typing must pause before the address bar shows the new inputs.
const URL_SYNC_DELAY: std::time::Duration = std::time::Duration::from_millis(200);

/// Plans the advisor lists at most.
const ADVICE_LIMIT: usize = 12;

/// How long the inputs must rest before the advisor searches: typing pays only for the
/// numbers, and the plans follow once the person pauses.
const ADVICE_DELAY: std::time::Duration = std::time::Duration::from_millis(150);

/// Runs the newest task given to it once `delay` has passed with no newer one: the work a
/// keystroke schedules this way is paid once the typing pauses.
#[derive(Clone, Copy)]
struct Debounced {
    newest: StoredValue<u64>,
    delay: std::time::Duration,
}

impl Debounced {
    fn new(delay: std::time::Duration) -> Self {
        Self {
            newest: StoredValue::new(0),
            delay,
        }
    }

    /// Drops the task waiting, if any; returns the generation the next task carries.
    fn cancel(self) -> u64 {
        let generation = self.newest.get_value().wrapping_add(1);
        self.newest.set_value(generation);
        generation
    }

    /// Replaces the task waiting with `task`.
    fn run(self, task: impl FnOnce() + 'static) {
        let generation = self.cancel();
        set_timeout(
            move || {
                if self.newest.get_value() == generation {
                    task();
                }
            },
            self.delay,
        );
    }
}

/// `f` behind a memo: a reader re-runs only when the value changes, not on every keystroke.
fn memo_fn<T>(f: impl Fn() -> T + Send + Sync + 'static) -> impl Fn() -> T + Copy
where
    T: Clone + PartialEq + Send + Sync + 'static,
{
    let memo = Memo::new(move |_| f());
    move || memo.get()
}

/// The whole estimator page.
#[component]
pub fn App() -> impl IntoView {
    let Decoded { state, notices } = initial_state();
    let state = RwSignal::new(state);
    let notices = RwSignal::new(notices);

    let unit = Memo::new(move |_| state.with(|s| s.byte_unit));
    let mode = Memo::new(move |_| state.with(|s| s.mode));
    // One parse per change: everything below reads the parsed page, never the text.
    let page = Memo::new(move |_| state.with(parse_page));
    let field_errors = Memo::new(move |_| page.with(|p| p.field_errors.clone()));
    let config_error = Memo::new(move |_| page.with(|p| p.config_error.clone()));
    let evaluation = Memo::new(move |_| {
        page.with(|p| {
            p.scenario
                .as_ref()
                .map_err(Clone::clone)
                .and_then(Scenario::evaluate)
        })
    });
    // What the estimate of the chosen model leaves out or assumes (architecture mode).
    let model_notes = Memo::new(move |_| page.with(|p| p.notes.clone()));
    let evaluated = Signal::derive(move || evaluation.get().ok());

    let sweep_rows = Signal::derive(move || -> Vec<SweepRow> {
        evaluation.with(|e| e.as_ref().map(|e| e.sweep.clone()).unwrap_or_default())
    });
    let parts = Signal::derive(move || {
        evaluation.with(|e| {
            e.as_ref().ok().map(|e: &Evaluation| {
                e.step
                    .parts
                    .iter()
                    .filter(|(kind, bytes)| {
                        *bytes > 0
                            || matches!(
                                kind,
                                PartKind::Weights
                                    | PartKind::Gradients
                                    | PartKind::OptimizerStates
                                    | PartKind::Activations
                            )
                    })
                    .map(|(kind, bytes)| BreakdownPart {
                        testid: kind.key(),
                        label: kind.label(),
                        bytes: *bytes,
                        // What the activations are for (architecture mode; empty otherwise).
                        details: if *kind == PartKind::Activations {
                            e.step
                                .activation_parts
                                .iter()
                                .map(|(part, bytes)| BreakdownDetail {
                                    key: part.key(),
                                    label: part.label(),
                                    bytes: *bytes,
                                })
                                .collect()
                        } else {
                            Vec::new()
                        },
                    })
                    .collect()
            })
        })
    });
    let total =
        Signal::derive(move || evaluation.with(|e| e.as_ref().ok().map(|e| e.step.peak_bytes)));
    let problem =
        Signal::derive(move || evaluation.with(|e| e.as_ref().err().map(ToString::to_string)));
    let per_gpu = Memo::new(move |_| evaluation.with(|e| e.as_ref().is_ok_and(|e| e.per_gpu)));
    let total_label = Signal::derive(move || match (mode.get(), per_gpu.get()) {
        (Mode::Simple, false) => "Total",
        (Mode::Simple, true) => "Total per GPU",
        (Mode::Architecture, false) => "Peak",
        (Mode::Architecture, true) => "Peak per GPU",
    });
    // with pipeline parallelism: whose GPU the figures are
    let stage_line = move || {
        evaluation.with(|e| {
            let e = e.as_ref().ok()?;
            let index = e.step.stage?;
            Some(format!(
                "Figures of pipeline stage {} of {}, the busiest ({} micro-batches in flight at most, {}).",
                index + 1,
                e.plan.pipeline_parallel,
                e.step.stage_in_flight,
                e.plan.pipeline_schedule.label()
            ))
        })
    };
    let capacity_line = Signal::derive(move || {
        evaluation.with(|e| {
            e.as_ref().ok().and_then(|e| {
                e.plan
                    .capacity_bytes
                    .map(|c| largest_peak_that_fits(c, &e.plan.overheads))
            })
        })
    });

    // Storage follows every change (it is cheap); the address bar, replaced so that Back
    // leaves the page, follows once typing pauses for URL_SYNC_DELAY, since Chromium's
    // replaceState costs milliseconds a call. The share link carries the query at once.
    let query = Memo::new(move |_| state.with(encode_query));
    let url_sync = Debounced::new(URL_SYNC_DELAY);
    Effect::new(move |_| {
        query.with(|q| browser::store(q));
        url_sync.run(move || query.with_untracked(|q| browser::replace_query(q)));
    });
    // The tab's title too: setting it costs about a twentieth of a keystroke.
    let title_sync = Debounced::new(URL_SYNC_DELAY);
    Effect::new(move |_| {
        let title = match total.get() {
            Some(bytes) => format!(
                "{} · Batch Size Memory Estimator",
                format_bytes(bytes, unit.get())
            ),
            None => "Batch Size Memory Estimator".to_owned(),
        };
        title_sync.run(move || browser::set_title(&title));
    });

    // Memos, so that a keystroke notifies (and re-renders) only the field whose text changed.
    let value_of = move |field: Field| -> Signal<String> {
        Memo::new(move |_| state.with(|s| s.get(field).unwrap_or_default())).into()
    };
    let setter = move |field: Field| {
        Callback::new(move |value: String| {
            state.update(|s| {
                // A choice from a list is always valid; a too-long text is refused by maxlength.
                let _ = s.set(field, &value);
            });
        })
    };
    // the trainer is not an input of its own: it names the defaults the inputs have
    let trainer_value: Signal<String> = Memo::new(move |_| {
        state.with(|s| {
            Trainer::matching(s)
                .map_or("custom", Trainer::key)
                .to_owned()
        })
    })
    .into();
    let set_trainer = Callback::new(move |key: String| {
        if let Some(t) = Trainer::from_key(&key) {
            state.update(|s| t.apply(s));
        }
    });
    let error_of = move |field: Field| -> Signal<Option<String>> {
        Memo::new(move |_| {
            field_errors.with(|errors| {
                errors
                    .iter()
                    .find(|(f, _)| *f == field)
                    .map(|(_, e)| e.clone())
            })
        })
        .into()
    };
    let is_arch = move || mode.get() == Mode::Architecture;
    let is_custom_model = memo_fn(move || state.with(|s| s.model.preset.is_none()));
    let is_inference = memo_fn(move || state.with(|s| !s.step.optimizer.trains()));
    let is_custom_gpu = memo_fn(move || state.with(|s| s.hardware.gpu == Some(Gpu::Custom)));
    let is_vision = memo_fn(move || page.with(|p| p.is_vision));
    let is_moe = memo_fn(move || page.with(|p| p.is_moe));
    let is_cpu_ram = memo_fn(move || state.with(|s| s.hardware.gpu == Some(Gpu::CpuRam)));
    let fits_now = Memo::new(move |_| {
        evaluation.with(|e| {
            e.as_ref()
                .is_ok_and(|e| e.verdict.as_ref().is_some_and(|v| v.fits()))
        })
    });
    // The advisor runs when the step does not fit, or when asked to.
    let show_plans = RwSignal::new(false);
    // The advisor searches many steps (milliseconds): it runs in a task once the inputs have
    // rested for ADVICE_DELAY, after the numbers are on screen; a stale task does nothing.
    let advice: RwSignal<Option<Result<Vec<FitPlan>, String>>> = RwSignal::new(None);
    let advice_search = Debounced::new(ADVICE_DELAY);
    Effect::new(move |_| {
        // the plans' links keep the text as typed: any change of it renews them
        state.track();
        let wanted = !fits_now.get() || show_plans.get();
        let job = page.with(|p| {
            let scenario = p.scenario.as_ref().ok()?;
            scenario.plan().capacity_bytes?;
            Some(wanted.then(|| (scenario.clone(), state.get_untracked())))
        });
        match job {
            None => {
                advice_search.cancel();
                advice.set(None);
            }
            Some(None) => {
                advice_search.cancel();
                advice.set(Some(Ok(Vec::new())));
            }
            Some(Some((scenario, inputs))) => advice_search.run(move || {
                advice.set(Some(
                    scenario
                        .advise(&inputs, ADVICE_LIMIT)
                        .map_err(|e| e.to_string()),
                ));
            }),
        }
    });
    let is_peft = memo_fn(move || {
        state.with(|s| s.training.method != Method::Full && s.step.optimizer.trains())
    });
    let is_qlora = memo_fn(move || {
        state.with(|s| s.training.method == Method::Qlora && s.step.optimizer.trains())
    });

    let model_groups = preset_groups();
    let model_options = vec![(CUSTOM_MODEL_KEY, "Custom: paste or upload config.json")];
    let mut gpu_options: Vec<(&'static str, &'static str)> = vec![("none", "No GPU in particular")];
    gpu_options.extend(options(&Gpu::ALL, Gpu::key, Gpu::label));

    let on_model = Callback::new(move |key: String| {
        state.update(|s| {
            if s.set(Field::Model, &key).is_ok() {
                if let Some(preset) = s.model.preset {
                    s.step.seq_len = preset.default_seq_len().to_string();
                }
            }
        });
    });

    // The parameter count, the peak's phase and the share link, above the breakdown.
    let summary = move || {
        let mut m = Markup::default();
        evaluation.with(|e| {
            let Ok(e) = e else { return };
            m.el(
                "span",
                &[
                    ("data-testid", "n-params"),
                    ("data-value", &e.n_params.to_string()),
                ],
                &format!("{} parameters", group_thousands(e.n_params)),
            );
            // A mixture of experts runs only some of its parameters for each token.
            if let Some(active) = page.with(|p| p.active_params) {
                m.text(" ").el(
                    "span",
                    &[
                        ("data-testid", "active-params"),
                        ("data-value", &active.to_string()),
                    ],
                    &format!("({} active per token)", group_thousands(active)),
                );
            }
            // LoRA / QLoRA train only the adapters
            if is_arch() && is_peft() {
                let n = e.step.trainable_params;
                m.text(" ").el(
                    "span",
                    &[
                        ("data-testid", "trainable-params"),
                        ("data-value", &n.to_string()),
                    ],
                    &format!("({} trainable)", group_thousands(n)),
                );
            }
            if let Some(p) = e.step.peak_phase {
                m.text(" · peak in the ")
                    .el(
                        "strong",
                        &[("data-testid", "peak-phase"), ("data-phase", p.key())],
                        &p.label().to_ascii_lowercase(),
                    )
                    .text(" phase");
            }
            m.el(
                "span",
                &[("data-testid", "per-gpu-note")],
                if e.per_gpu {
                    " · figures are per GPU"
                } else {
                    ""
                },
            )
            .text(" · ")
            .el(
                "a",
                &[
                    ("data-testid", "share-link"),
                    ("href", &query.with(|q| format!("?{q}"))),
                ],
                "Link to these inputs",
            );
        });
        m.finish()
    };
    let has_figures = Memo::new(move |_| evaluation.with(Result::is_ok));
    // The peak and the verdict, kept in view on a phone.
    let sticky = move || {
        let mut m = Markup::default();
        evaluation.with(|e| match e {
            Ok(e) => {
                let unit = unit.get();
                let fits = e.verdict.as_ref().map(|v| v.fits());
                m.el(
                    "span",
                    &[],
                    &format!(
                        "{} {}",
                        total_label.get(),
                        format_bytes(e.step.peak_bytes, unit)
                    ),
                )
                .text(" · ")
                .el(
                    "span",
                    &[(
                        when(fits.is_some(), "class"),
                        if fits == Some(true) { "fits" } else { "no-fit" },
                    )],
                    &e.verdict_text(unit).unwrap_or_default(),
                );
                if fits == Some(false) {
                    m.text(" ")
                        .el("a", &[("href", "#advice-title")], "What to change");
                }
            }
            Err(_) => {
                m.el(
                    "span",
                    &[],
                    "Fix the highlighted fields to see the figures.",
                );
            }
        });
        m.finish()
    };

    view! {
        <header class="page-header">
            <h1>"Batch Size Memory Estimator"</h1>
            <p class="lede">
                "How much GPU memory one training step needs, where it goes, and which batch size fits."
            </p>
        </header>
        <Notices notices=notices />
        // On a phone the results come after the form: the peak and the verdict stay in view.
        <div class="sticky-summary" data-testid="sticky-summary" aria-hidden="true" inner_html=sticky></div>
        <main class="layout">
            <form class="card inputs" aria-labelledby="inputs-title" on:submit=|ev| ev.prevent_default()>
                <h2 id="inputs-title">"Model and training step"</h2>
                <RadioGroup legend="Describe the model" name="mode" testid="mode"
                    options=options(&Mode::ALL, Mode::key, Mode::label)
                    value=value_of(Field::Mode) on_change=setter(Field::Mode) />
                <div class="when" hidden=is_arch>
                    <div class="field-row">
                        <NumberField label="Model parameters" testid="params"
                            hint="Decimals allowed: 0.5 with B is 500 million."
                            value=value_of(Field::Params) on_input=setter(Field::Params) error=error_of(Field::Params) />
                        <SelectField label="Unit" testid="params-unit"
                            options=options(&ParamUnit::ALL, ParamUnit::key, ParamUnit::label)
                            value=value_of(Field::ParamsUnit) on_change=setter(Field::ParamsUnit) />
                    </div>
                    <SelectField label="Numerical precision" testid="precision"
                        options=options(&Precision::ALL, Precision::key, Precision::label)
                        value=value_of(Field::Precision) on_change=setter(Field::Precision) />
                    // each mode has its own optimizer list, and only one may be in the page
                    <Show when=move || !is_arch()>
                        <SelectField label="Optimizer" testid="optimizer"
                            options=options(&SIMPLE_OPTIMIZERS, Optimizer::key, Optimizer::label)
                            value=value_of(Field::Optimizer) on_change=setter(Field::Optimizer) />
                    </Show>
                </div>
                <div class="when" hidden=move || !is_arch()>
                    <SelectField label="Model" testid="model"
                        groups=model_groups.clone() options=model_options.clone()
                        value=value_of(Field::Model) on_change=on_model />
                    <div class="when" hidden=move || !is_custom_model()>
                        <ConfigInput value=Memo::new(move |_| state.with(|s| s.model.config_json.clone()))
                            on_change=Callback::new(move |text: String| state.update(|s| {
                                let _ = s.set(Field::Config, &text);
                            }))
                            error=config_error />
                    </div>
                    <NumberField
                        label=Signal::derive(move || {
                            if is_vision() { "Image size (pixels per side)" } else { "Sequence length (tokens)" }
                        })
                        testid="seq"
                        hint="Tokens per sample; for ViT the image side in pixels."
                        value=value_of(Field::SeqLen) on_input=setter(Field::SeqLen) error=error_of(Field::SeqLen) />
                    <SelectField label="Precision recipe" testid="recipe"
                        options=options(&PrecisionRecipe::ALL, PrecisionRecipe::key, PrecisionRecipe::label)
                        value=value_of(Field::Recipe) on_change=setter(Field::Recipe) />
                    <Show when=is_arch>
                        <SelectField label="Optimizer" testid="optimizer"
                            options=options(&Optimizer::ALL, Optimizer::key, Optimizer::label)
                            value=value_of(Field::Optimizer) on_change=setter(Field::Optimizer) />
                    </Show>
                    <div class="when" hidden=is_inference>
                        <SelectField label="Trainer (sets attention, checkpointing, loss, packing)" testid="trainer"
                            options=trainer_options()
                            value=trainer_value on_change=set_trainer />
                    </div>
                    <SelectField label="Attention kernel" testid="attention"
                        options=options(&AttentionKernel::ALL, AttentionKernel::key, AttentionKernel::label)
                        value=value_of(Field::Attention) on_change=setter(Field::Attention) />
                    <SelectField label="Activation checkpointing" testid="checkpointing"
                        options=options(&Checkpointing::ALL, Checkpointing::key, Checkpointing::label)
                        value=value_of(Field::Checkpointing) on_change=setter(Field::Checkpointing) />
                    <div class="when" hidden=is_inference>
                        <SelectField label="Loss (trainer)" testid="loss"
                            options=options(&LossKind::ALL, LossKind::key, LossKind::label)
                            value=value_of(Field::Loss) on_change=setter(Field::Loss) />
                        <SelectField label="Sequence packing" testid="packing"
                            options=vec![("off", "Off: one sample per row"), ("on", "On: documents packed, position ids restart")]
                            value=value_of(Field::Packing) on_change=setter(Field::Packing) />
                        <SelectField label="Optimizer step" testid="optimizer-in-backward"
                            options=vec![("off", "After backward (all gradients kept)"), ("on", "In backward (torchtune's optimizer_in_bwd)")]
                            value=value_of(Field::OptimizerInBackward) on_change=setter(Field::OptimizerInBackward) />
                        <SelectField label="Activation offloading" testid="activation-offload"
                            options=vec![("off", "Off"), ("on", "On: saved tensors in CPU memory (torchtune)")]
                            value=value_of(Field::ActivationOffload) on_change=setter(Field::ActivationOffload) />
                        <SelectField label="Padded rows" testid="padding"
                            options=vec![("off", "Off: every token real (the mask is dropped)"), ("on", "On: padding in the attention mask")]
                            value=value_of(Field::Padding) on_change=setter(Field::Padding) />
                    </div>
                    <div class="when" hidden=is_inference>
                        <SelectField label="Training method" testid="method"
                            options=options(&Method::ALL, Method::key, Method::label)
                            value=value_of(Field::Method) on_change=setter(Field::Method) />
                    </div>
                    <div class="when" hidden=move || !is_peft()>
                        <fieldset class="peft" data-testid="peft-settings">
                            <legend>"LoRA adapters (peft)"</legend>
                            <NumberField label="Rank r" testid="lora-rank"
                                value=value_of(Field::LoraRank) on_input=setter(Field::LoraRank) error=error_of(Field::LoraRank) />
                            <NumberField label="lora_alpha" testid="lora-alpha"
                                hint="Scales the adapters' output (alpha / r): no effect on memory."
                                value=value_of(Field::LoraAlpha) on_input=setter(Field::LoraAlpha) error=error_of(Field::LoraAlpha) />
                            <NumberField label="lora_dropout" testid="lora-dropout"
                                hint="Above 0, every adapted linear keeps a dropout mask."
                                value=value_of(Field::LoraDropout) on_input=setter(Field::LoraDropout) error=error_of(Field::LoraDropout) />
                            <NumberField label="Target modules" testid="lora-targets" text=true
                                hint="all-linear, attention, mlp, or module names such as q_proj,v_proj."
                                value=value_of(Field::LoraTargets) on_input=setter(Field::LoraTargets) error=error_of(Field::LoraTargets) />
                            <SelectField label="Adapter dtype" testid="lora-dtype"
                                options=vec![("fp32", "fp32 (peft's default)"), ("model", "The base model's dtype")]
                                value=value_of(Field::LoraDtype) on_change=setter(Field::LoraDtype) />
                            <div class="when" hidden=move || !is_qlora()>
                                <SelectField label="4-bit type (bitsandbytes)" testid="quant"
                                    options=options(&Quant4::ALL, Quant4::key, Quant4::key)
                                    value=value_of(Field::Quant) on_change=setter(Field::Quant) />
                                <SelectField label="Double quantization" testid="double-quant"
                                    options=vec![("on", "On"), ("off", "Off")]
                                    value=value_of(Field::DoubleQuant) on_change=setter(Field::DoubleQuant) />
                                <SelectField label="prepare_model_for_kbit_training" testid="kbit-prepare"
                                    options=vec![("on", "On: unquantized weights in fp32"), ("off", "Off")]
                                    value=value_of(Field::KbitPrepare) on_change=setter(Field::KbitPrepare) />
                            </div>
                        </fieldset>
                    </div>
                    <div class="when" hidden=move || !is_inference()>
                        <NumberField label="Generated tokens (KV cache)" testid="new-tokens"
                            hint="Tokens generated after the prompt; 0 for a single forward pass."
                            value=value_of(Field::NewTokens) on_input=setter(Field::NewTokens) error=error_of(Field::NewTokens) />
                        <SelectField label="Weight format" testid="weight-format"
                            options=options(&WeightFormat::ALL, WeightFormat::key, WeightFormat::label)
                            value=value_of(Field::WeightFormat) on_change=setter(Field::WeightFormat) />
                        <SelectField label="KV-cache dtype" testid="kv-dtype"
                            options=options(&KvDtype::ALL, KvDtype::key, KvDtype::label)
                            value=value_of(Field::KvDtype) on_change=setter(Field::KvDtype) />
                    </div>
                </div>
                <NumberField label="Batch size" testid="batch"
                    hint="Samples per step (per GPU), a whole number."
                    value=value_of(Field::Batch) on_input=setter(Field::Batch) error=error_of(Field::Batch) />
                <div class="when" hidden=is_arch>
                    <NumberField label="Activation memory per sample (MB)" testid="act-mb"
                        hint="Intermediate tensors one sample keeps for backward, in MB (10⁶ bytes)."
                        value=value_of(Field::ActivationMb) on_input=setter(Field::ActivationMb) error=error_of(Field::ActivationMb) />
                </div>

                <h3 class="section-title">"Hardware"</h3>
                <SelectField label="GPU" testid="gpu" options=gpu_options
                    value=value_of(Field::Gpu) on_change=setter(Field::Gpu) />
                <div class="when" hidden=move || !is_cpu_ram()>
                    <NumberField label="CPU RAM (GiB)" testid="ram-gib"
                        hint="The computer's memory; inference on the CPU has no CUDA context."
                        value=value_of(Field::RamCapacity) on_input=setter(Field::RamCapacity) error=error_of(Field::RamCapacity) />
                </div>
                <div class="when" hidden=move || !is_custom_gpu()>
                    <NumberField label="Custom capacity (MiB)" testid="gpu-capacity"
                        hint="Total memory as nvidia-smi reports it."
                        value=value_of(Field::CustomCapacity) on_input=setter(Field::CustomCapacity) error=error_of(Field::CustomCapacity) />
                </div>
                <div class="overheads">
                    <NumberField label="CUDA context (MiB)" testid="cuda-context"
                        value=value_of(Field::CudaContext) on_input=setter(Field::CudaContext) error=error_of(Field::CudaContext) />
                    <NumberField label="Allocator reserve (%)" testid="allocator-reserve"
                        value=value_of(Field::AllocatorReserve) on_input=setter(Field::AllocatorReserve) error=error_of(Field::AllocatorReserve) />
                    <NumberField label="Safety margin (%)" testid="safety-margin"
                        value=value_of(Field::SafetyMargin) on_input=setter(Field::SafetyMargin) error=error_of(Field::SafetyMargin) />
                </div>
                <fieldset class="parallelism" data-testid="parallelism">
                    <legend>"Parallelism (figures per GPU)"</legend>
                    <NumberField label="Data-parallel GPUs" testid="num-gpus"
                        hint="Replicas of the step; GPUs in all = this x tensor x context."
                        value=value_of(Field::NumGpus) on_input=setter(Field::NumGpus) error=error_of(Field::NumGpus) />
                    <SelectField label="Data-parallel engine" testid="sharding"
                        options=options(&Sharding::ALL, Sharding::key, Sharding::label)
                        value=value_of(Field::Sharding) on_change=setter(Field::Sharding) />
                    <div class="when" hidden=move || !is_arch()>
                        <SelectField label="FSDP2 reshard after forward" testid="reshard-after-forward"
                            options=vec![("on", "On: each layer re-gathered for backward"), ("off", "Off: gathered layers kept until backward")]
                            value=value_of(Field::ReshardAfterForward) on_change=setter(Field::ReshardAfterForward) />
                        <NumberField label="Tensor parallelism (GPUs per group)" testid="tensor-parallel"
                            hint="torchtitan's plan: heads, MLP and vocabulary split; norms and the residual stream whole."
                            value=value_of(Field::TensorParallel) on_input=setter(Field::TensorParallel) error=error_of(Field::TensorParallel) />
                        <SelectField label="Sequence parallelism" testid="sequence-parallel"
                            options=vec![("off", "Off"), ("on", "On: norms and residuals on a slice of the tokens")]
                            value=value_of(Field::SequenceParallel) on_change=setter(Field::SequenceParallel) />
                        <SelectField label="Loss parallelism" testid="loss-parallel"
                            options=vec![("off", "Off: logits gathered whole on every GPU"), ("on", "On: loss on each GPU's vocabulary slice")]
                            value=value_of(Field::LossParallel) on_change=setter(Field::LossParallel) />
                        <NumberField label="Context parallelism (GPUs per group)" testid="context-parallel"
                            hint="Ring attention: the sequence split over the group."
                            value=value_of(Field::ContextParallel) on_input=setter(Field::ContextParallel) error=error_of(Field::ContextParallel) />
                        <NumberField label="Pipeline stages" testid="pipeline-parallel"
                            hint="Layers split into stages; the figures are the busiest stage's GPU."
                            value=value_of(Field::PipelineParallel) on_input=setter(Field::PipelineParallel) error=error_of(Field::PipelineParallel) />
                        <SelectField label="Pipeline schedule" testid="pipeline-schedule"
                            options=options(&PipelineSchedule::ALL, PipelineSchedule::key, PipelineSchedule::label)
                            value=value_of(Field::PipelineSchedule) on_change=setter(Field::PipelineSchedule) />
                        <NumberField label="Micro-batches per step" testid="microbatches"
                            hint="Through the pipeline; empty: one per stage."
                            value=value_of(Field::Microbatches) on_input=setter(Field::Microbatches) error=error_of(Field::Microbatches) />
                        <NumberField label="Expert-parallel GPUs" testid="expert-parallel"
                            hint=Signal::derive(move || {
                                if is_moe() {
                                    "Splits the routed experts across the group; must divide the number of GPUs."
                                } else {
                                    "This model has no experts: no effect."
                                }
                            })
                            value=value_of(Field::ExpertParallel) on_input=setter(Field::ExpertParallel) error=error_of(Field::ExpertParallel) />
                    </div>
                </fieldset>
                <NumberField label="Target global batch (optional)" testid="global-batch"
                    hint="Samples per optimizer step, reached with gradient accumulation."
                    value=value_of(Field::GlobalBatch) on_input=setter(Field::GlobalBatch) error=error_of(Field::GlobalBatch) />

                <RadioGroup legend="Show figures in" name="unit" testid="unit"
                    options=options(&ByteUnit::ALL, ByteUnit::key, ByteUnit::label)
                    value=value_of(Field::ByteUnit) on_change=setter(Field::ByteUnit) />
            </form>
            <div class="results">
                {move || has_figures.get().then(|| view! { <p class="summary-line" inner_html=summary></p> })}
                <ModelNotes notes=model_notes />
                <BreakdownCard parts=parts total=total problem=problem unit=unit total_label=total_label />
                {move || stage_line().map(|line| view! { <p class="stage" data-testid="pipeline-stage">{line}</p> })}
                <VerdictCard evaluation=evaluated unit=unit />
                <FitAdvice plans=advice fits_now=fits_now show=show_plans unit=unit />
                <MemoryChart rows=sweep_rows capacity_line=capacity_line unit=unit />
                <SweepTable rows=sweep_rows unit=unit />
            </div>
        </main>
        <Explanations mode=mode />
        <footer class="page-footer">
            <p>"Runs entirely in your browser: nothing you type leaves this page."</p>
        </footer>
    }
}
