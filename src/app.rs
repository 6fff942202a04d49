//! The page: the inputs as one signal, everything shown as memos over the core crate.

use estimator_core::{
    decode_query, encode_query, format_bytes, group_thousands, largest_peak_that_fits, parse_page,
    sweep_markdown, sweep_tsv, ByteUnit, Decoded, Evaluation, EvaluationError, Field,
    LongestSequence, Method, Mode, ObjectiveKind, PartKind, Scenario, SweepAxis, SweepRow,
};
use leptos::prelude::*;

use crate::browser;
use crate::components::{
    bar_markup, body_markup, breakdown_card, chart_markup, head_markup, memory_chart, model_notes,
    notes_markup, rows_markup, serving_card, serving_markup, serving_tsv, sweep_table,
    total_markup, verdict_card, verdict_markup, BreakdownDetail, BreakdownPart, FitAdvice, Notices,
};
use crate::effect::{memo, watch};
use crate::form::input_form;
use crate::markup::{when, Markup};
use crate::worker::advice_markup;

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

/// The lines of the breakdown: the four categories always, the others when they hold
/// anything; under the activations, what they are for (architecture mode).
fn breakdown_parts(e: &Evaluation) -> Vec<BreakdownPart> {
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
}

/// How long typing must pause before the address bar shows the new inputs.
const URL_SYNC_DELAY: std::time::Duration = std::time::Duration::from_millis(200);

/// How long the inputs must rest before the advisor's plans are shown: typing pays only for
/// the numbers, and the plans follow once the person pauses.
const ADVICE_DELAY: std::time::Duration = std::time::Duration::from_millis(150);

/// How long the inputs must rest before the advisor's worker is asked: its search (tens of
/// milliseconds) is then over before ADVICE_DELAY, and a burst of keystrokes asks once.
const ADVICE_ASK_DELAY: std::time::Duration = std::time::Duration::from_millis(40);

/// How long the inputs must rest before the longest sequence that fits is searched (a few
/// dozen estimates and a few allocator replays: milliseconds), with the sweep over lengths:
/// typing pays none of it.
const SEQ_SEARCH_DELAY: std::time::Duration = std::time::Duration::from_millis(40);

/// The longest sequence that fits and the sweep over sequence lengths, searched once the
/// inputs rest, for the inputs of `query`.
struct SeqAnswer {
    /// The inputs it answers, as their query string: shown only while they are the page's.
    query: String,
    /// The longest sequence that fits (`None`: no GPU, the simple mode, an image model).
    longest: Option<LongestSequence>,
    /// The page at that length (`?query`), empty when none fits.
    link: String,
    /// The sweep over sequence lengths, when the table shows it.
    rows: Vec<SweepRow>,
}

/// `f` of the rows the sweep table and the chart show: the sweep over lengths (its latest
/// answer) when `seq`, else the batch sweep of the evaluation.
fn with_sweep<T>(
    seq: bool,
    evaluation: Memo<Result<Evaluation, EvaluationError>>,
    answer: RwSignal<Option<SeqAnswer>>,
    f: impl FnOnce(&[SweepRow]) -> T,
) -> T {
    if seq {
        answer.with(|a| f(a.as_ref().map_or(&[][..], |a| &a.rows)))
    } else {
        evaluation.with(|e| f(e.as_ref().map_or(&[][..], |e| &e.sweep)))
    }
}

/// Runs the newest task given to it once `delay` has passed with no newer one: the work a
/// keystroke schedules this way is paid once the typing pauses.
///
/// One timer waits at a time: a newer task only moves the deadline, and the timer, when it
/// fires before it, waits the rest (a keystroke sets no timer of its own).
#[derive(Clone, Copy)]
struct Debounced {
    pending: StoredValue<Pending, LocalStorage>,
    delay_ms: f64,
}

/// A [`Debounced`]'s task and timer.
struct Pending {
    task: Option<Box<dyn FnOnce()>>,
    /// When the task is due, in milliseconds since the epoch.
    due: f64,
    /// Whether a timer is set.
    waiting: bool,
}

impl Debounced {
    fn new(delay: std::time::Duration) -> Self {
        Self {
            pending: StoredValue::new_local(Pending {
                task: None,
                due: 0.0,
                waiting: false,
            }),
            delay_ms: delay.as_secs_f64() * 1000.0,
        }
    }

    /// Drops the task waiting, if any.
    fn cancel(self) {
        self.pending.update_value(|p| p.task = None);
    }

    /// Replaces the task waiting with `task`, due `delay` from now.
    fn run(self, task: impl FnOnce() + 'static) {
        let set_timer = self
            .pending
            .try_update_value(|p| {
                p.task = Some(Box::new(task));
                p.due = now_ms() + self.delay_ms;
                !std::mem::replace(&mut p.waiting, true)
            })
            .unwrap_or(false);
        if set_timer {
            self.wait(self.delay_ms);
        }
    }

    fn wait(self, ms: f64) {
        set_timeout(
            move || {
                // the time left if the task is not due yet, else the task (taken)
                let left_or_task = self.pending.try_update_value(|p| {
                    let left = p.due - now_ms();
                    if left > 0.0 && p.task.is_some() {
                        Ok(left)
                    } else {
                        p.waiting = false;
                        Err(p.task.take())
                    }
                });
                match left_or_task {
                    Some(Ok(left)) => self.wait(left),
                    Some(Err(Some(task))) => task(),
                    _ => {}
                }
            },
            // whole milliseconds, rounded up: the timer never fires before the task is due
            std::time::Duration::from_millis(ms.ceil() as u64),
        );
    }
}

/// Where the advisor's worker is with the inputs.
#[derive(Default)]
struct AdvisorWorker {
    /// Whether the worker runs (`None` until it is first needed).
    runs: Option<bool>,
    /// The query it was last asked, empty once the inputs change.
    asked: String,
    /// Its answer to `asked`, until shown.
    answer: Option<String>,
    /// Whether the inputs have rested for `ADVICE_DELAY` since they changed.
    rested: bool,
}

/// Milliseconds since the epoch.
fn now_ms() -> f64 {
    web_sys::js_sys::Date::now()
}

/// The whole estimator page.
#[component]
pub fn App() -> impl IntoView {
    let Decoded { state, notices } = initial_state();
    let state = RwSignal::new(state);
    let notices = RwSignal::new(notices);

    let unit = memo(move |_| state.with(|s| s.byte_unit));
    let mode = memo(move |_| state.with(|s| s.mode));
    // One parse per change: everything below reads the parsed page, never the text.
    let page = memo(move |_| state.with(parse_page));
    let evaluation = memo(move |_| {
        page.with(|p| {
            p.scenario
                .as_ref()
                .map_err(Clone::clone)
                .and_then(Scenario::evaluate)
        })
    });
    // What the estimate of the chosen model leaves out or assumes (architecture mode).
    let notes = memo(move |_| page.with(|p| notes_markup(&p.notes)));

    let per_gpu = memo(move |_| evaluation.with(|e| e.as_ref().is_ok_and(|e| e.per_gpu)));
    let total_label = move || match (mode.get(), per_gpu.get()) {
        (Mode::Simple, false) => "Total",
        (Mode::Simple, true) => "Total per GPU",
        (Mode::Architecture, false) => "Peak",
        (Mode::Architecture, true) => "Peak per GPU",
    };
    // The cards' markups, each from the evaluation.
    let breakdown_total = memo(move |_| {
        evaluation.with(|e| {
            let problem = e.as_ref().err().map(ToString::to_string);
            total_markup(
                e.as_ref().ok().map(|e| e.step.peak_bytes),
                e.as_ref()
                    .ok()
                    .filter(|e| e.step.peak_phase.is_some())
                    .map(Evaluation::reserved_bytes),
                problem.as_deref(),
                unit.get(),
                total_label(),
            )
        })
    });
    let breakdown_bar = memo(move |_| {
        evaluation.with(|e| {
            e.as_ref().map_or_else(
                |_| Vec::new(),
                |e| bar_markup(&breakdown_parts(e), Some(e.step.peak_bytes)),
            )
        })
    });
    let breakdown_rows = memo(move |_| {
        evaluation.with(|e| {
            e.as_ref().map_or_else(
                |_| Vec::new(),
                |e| rows_markup(&breakdown_parts(e), Some(e.step.peak_bytes), unit.get()),
            )
        })
    });
    // The page as a query string: the share link, the address bar, the searches' key.
    let query = memo(move |_| state.with(encode_query));
    // The longest sequence that fits, and the sweep over lengths: searched once the inputs
    // rest, shown while they are the inputs searched.
    let seq_answer: RwSignal<Option<SeqAnswer>> = RwSignal::new(None);
    let seq_shown = memo(move |_| {
        state.with(|s| s.sweep_axis == SweepAxis::Seq && s.mode == Mode::Architecture)
            && !page.with(|p| p.is_vision)
    });
    let seq_search = Debounced::new(SEQ_SEARCH_DELAY);
    watch(move || {
        query.track();
        // the task reads the inputs when it runs: the newest ones
        seq_search.run(move || {
            let (longest, rows) = page.with_untracked(|p| {
                p.scenario.as_ref().map_or((None, Vec::new()), |s| {
                    let longest = s.longest_sequence();
                    let rows = if seq_shown.get_untracked() {
                        s.sequence_sweep(longest.as_ref())
                    } else {
                        Vec::new()
                    };
                    (longest, rows)
                })
            });
            // the page at that length: the sequence, or DPO's and GRPO's completion
            let link = match longest.and_then(|l| l.tokens) {
                Some(tokens) => state.with_untracked(|s| {
                    let mut at = s.clone();
                    let tokens = tokens.to_string();
                    let _ = if at.step.objective == ObjectiveKind::Sft {
                        at.set(Field::SeqLen, &tokens)
                    } else {
                        at.set(Field::MaxCompletion, &tokens)
                    };
                    format!("?{}", encode_query(&at))
                }),
                None => String::new(),
            };
            seq_answer.set(Some(SeqAnswer {
                query: query.get_untracked(),
                longest,
                link,
                rows,
            }));
        });
    });
    let verdict = memo(move |_| {
        evaluation.with(|e| {
            seq_answer.with(|a| {
                let longest = a
                    .as_ref()
                    .filter(|a| query.with(|q| *q == a.query))
                    .and_then(|a| a.longest.as_ref().map(|l| (l, a.link.as_str())));
                verdict_markup(e.as_ref().ok(), unit.get(), longest)
            })
        })
    });
    let sweep_of = move |f: fn(&[SweepRow], ByteUnit) -> String| {
        move || {
            with_sweep(seq_shown.get(), evaluation, seq_answer, |rows| {
                f(rows, unit.get())
            })
        }
    };
    let chart = memo(move |_| {
        let line = evaluation.with(|e| {
            e.as_ref().ok().and_then(|e| {
                e.plan
                    .capacity_bytes
                    .map(|c| largest_peak_that_fits(c, &e.plan.overheads))
            })
        });
        with_sweep(seq_shown.get(), evaluation, seq_answer, |rows| {
            chart_markup(rows, line, unit.get())
        })
    });
    // The address bar (replaced so that Back leaves the page) and the stored inputs follow
    // once typing pauses for URL_SYNC_DELAY: Chromium's replaceState costs milliseconds a
    // call, and localStorage's setItem a tenth of a keystroke. The share link carries the
    // query at once.
    // Leaving the page within the pause stores what the pause would have.
    let _ = window_event_listener_untyped("pagehide", move |_| {
        query.with_untracked(|q| browser::store(q));
    });
    // The tab's title too, with the peak (setting it costs about a twentieth of a keystroke).
    let page_sync = Debounced::new(URL_SYNC_DELAY);
    watch(move || {
        query.track();
        page_sync.run(move || {
            query.with_untracked(|q| {
                browser::store(q);
                browser::replace_query(q);
            });
            let peak = evaluation.with_untracked(|e| e.as_ref().ok().map(|e| e.step.peak_bytes));
            browser::set_title(&match peak {
                Some(bytes) => format!(
                    "{} · Batch Size Memory Estimator",
                    format_bytes(bytes, unit.get_untracked())
                ),
                None => "Batch Size Memory Estimator".to_owned(),
            });
        });
    });

    let is_arch = memo(move |_| state.with(|s| s.mode == Mode::Architecture));
    let is_peft = memo(move |_| {
        state.with(|s| s.training.method != Method::Full && s.step.optimizer.trains())
    });
    let fits_now = memo(move |_| {
        evaluation.with(|e| {
            e.as_ref()
                .is_ok_and(|e| e.verdict.as_ref().is_some_and(|v| v.fits()))
        })
    });
    // The advisor runs when the step does not fit, or when asked to.
    let show_plans = RwSignal::new(false);
    // The advisor searches many steps (tens of milliseconds). Its worker searches once the
    // inputs have rested for ADVICE_ASK_DELAY, and the plans are shown once they have rested
    // for ADVICE_DELAY: the search overlaps the pause, and typing never waits for it. Where no
    // worker starts, the page searches itself after the pause. A stale answer does nothing.
    let advice: RwSignal<Option<String>> = RwSignal::new(None);
    let advice_ask = Debounced::new(ADVICE_ASK_DELAY);
    let advice_show = Debounced::new(ADVICE_DELAY);
    let advisor = StoredValue::new(AdvisorWorker::default());
    // the worker's answer, once it came for the newest inputs and the pause is over
    let show_answer = move || {
        let markup = advisor
            .try_update_value(|a| a.rested.then(|| a.answer.take()).flatten())
            .flatten();
        if markup.is_some() {
            advice.set(markup);
        }
    };
    let search_here = move || {
        let markup = page.with_untracked(|p| {
            let scenario = p.scenario.as_ref().ok()?;
            Some(state.with_untracked(|inputs| advice_markup(inputs, scenario)))
        });
        if markup.is_some() {
            advice.set(markup);
        }
    };
    let on_reply = move |reply: Option<(&str, &str)>| match reply {
        Some((query, markup)) => {
            advisor.update_value(|a| {
                if a.asked == query {
                    a.answer = Some(markup.to_owned());
                }
            });
            show_answer();
        }
        None => {
            // the worker failed: the page searches from now on
            let due = advisor
                .try_update_value(|a| {
                    a.runs = Some(false);
                    a.rested && !a.asked.is_empty()
                })
                .unwrap_or(false);
            if due {
                search_here();
            }
        }
    };
    watch(move || {
        // the plans' links keep the text as typed: any change of it renews them
        state.track();
        let wanted = !fits_now.get() || show_plans.get();
        let searchable = page.with(|p| {
            p.scenario
                .as_ref()
                .is_ok_and(|s| s.plan().capacity_bytes.is_some())
        });
        advisor.update_value(|a| {
            a.asked.clear();
            a.answer = None;
            a.rested = false;
        });
        if !searchable || !wanted {
            advice_ask.cancel();
            advice_show.cancel();
            // nothing while the inputs cannot be searched; no plans while the step fits
            let shown = searchable.then(String::new);
            if advice.with_untracked(|a| *a != shown) {
                advice.set(shown);
            }
        } else {
            // each task reads the inputs when it runs: the newest ones
            advice_ask.run(move || {
                let runs = advisor
                    .try_update_value(|a| {
                        *a.runs.get_or_insert_with(|| crate::worker::start(on_reply))
                    })
                    .unwrap_or(false);
                if runs {
                    let query = state.with_untracked(encode_query);
                    crate::worker::ask_worker(&query);
                    advisor.update_value(|a| a.asked = query);
                }
            });
            advice_show.run(move || {
                let runs = advisor
                    .try_update_value(|a| {
                        a.rested = true;
                        a.runs == Some(true)
                    })
                    .unwrap_or(false);
                if runs {
                    show_answer();
                } else {
                    search_here();
                }
            });
        }
    });
    // The parameter count, the peak's phase and the share link, above the breakdown.
    let summary = memo(move |_| {
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
            if is_arch.get() && is_peft.get() {
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
            // DPO and GRPO: each phase of the step, the one that sets the peak marked
            if let Some(p) = e.step.objective_phases {
                m.text(" · ");
                m.open("span", &[("data-testid", "step-phases")]);
                let phases = [
                    ("generation", "phase-generation", p.generation_bytes),
                    ("scoring", "phase-scoring", p.scoring_bytes),
                    ("training", "phase-training", Some(p.training_bytes)),
                ];
                let mut first = true;
                for (name, testid, bytes) in phases {
                    let Some(bytes) = bytes else { continue };
                    if !first {
                        m.text(", ");
                    }
                    first = false;
                    let tag = if p.peak.key() == name {
                        "strong"
                    } else {
                        "span"
                    };
                    m.open(
                        tag,
                        &[("data-testid", testid), ("data-bytes", &bytes.to_string())],
                    )
                    .text(name)
                    .text(" ")
                    .text(&format_bytes(bytes, unit.get()))
                    .close(tag);
                }
                m.close("span");
            }
            // with pipeline parallelism: whose GPU the figures are
            if let Some(index) = e.step.stage {
                m.text(" · ").el(
                    "span",
                    &[("data-testid", "pipeline-stage")],
                    &format!(
                        "Figures of pipeline stage {} of {}, the busiest ({} micro-batch{} in flight at most, {}).",
                        index + 1,
                        e.plan.pipeline_parallel,
                        e.step.stage_in_flight,
                        if e.step.stage_in_flight == 1 { "" } else { "es" },
                        e.plan.pipeline_schedule.label()
                    ),
                );
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
    });
    // vLLM's start-up, when serving is on, and the changes that let it start (as markup:
    // one string compared per change)
    let serving_body = memo(move |_| {
        page.with(|p| {
            let Some((s, Some(serving))) = p.scenario.as_ref().ok().map(|s| (s, s.serve())) else {
                return String::new();
            };
            let links = match &serving {
                Ok(now) => state.with(|inputs| s.serve_advice(inputs, now)),
                Err(_) => Vec::new(),
            };
            serving_markup(Some(&serving), &links, unit.get())
        })
    });
    let serving_sweep = memo(move |_| {
        page.with(|p| serving_tsv(p.scenario.as_ref().ok().and_then(Scenario::serve).as_ref()))
    });
    // The peak and the verdict, kept in view on a phone.
    let sticky = memo(move |_| {
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
                        total_label(),
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
    });

    // What the sweep varies: the batch or the sequence length (architecture mode, a model
    // of sequences).
    let axis_hidden = memo(move |_| !is_arch.get() || page.with(|p| p.is_vision));
    let is = move |axis: SweepAxis| move || state.with(|s| s.sweep_axis == axis);
    let axis_control = view! {
        <label class="sweep-axis" hidden=axis_hidden>
            "Vary "
            <select
                data-testid="sweep-axis"
                on:change=move |ev| {
                    let value = event_target_value(&ev);
                    state.update(|s| {
                        let _ = s.set(Field::SweepAxis, &value);
                    });
                }
            >
                <option value="batch" prop:selected=is(SweepAxis::Batch)>"Batch size"</option>
                <option value="seq" prop:selected=is(SweepAxis::Seq)>"Sequence length"</option>
            </select>
        </label>
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
            {input_form(state, page)}
            <div class="results">
                <p class="summary-line" inner_html=summary></p>
                {model_notes(notes)}
                {serving_card(serving_body, serving_sweep)}
                {breakdown_card(breakdown_total, breakdown_bar, breakdown_rows)}
                {verdict_card(verdict)}
                <FitAdvice plans=advice fits_now=fits_now show=show_plans />
                {memory_chart(chart, seq_shown)}
                {sweep_table(
                    memo(move |_| sweep_of(head_markup)()),
                    memo(move |_| {
                        with_sweep(seq_shown.get(), evaluation, seq_answer, |rows| body_markup(rows, unit.get()))
                    }),
                    memo(move |_| sweep_of(sweep_markdown)()),
                    memo(move |_| sweep_of(sweep_tsv)()),
                    seq_shown,
                    axis_control,
                )}
            </div>
        </main>
        <footer class="page-footer">
            <p>
                <a data-testid="about-link" href="about/index.html">"How it works, and answers to common questions"</a>
                " · Runs entirely in your browser: nothing you type leaves this page, but a Hub id you fetch."
            </p>
        </footer>
    }
}
