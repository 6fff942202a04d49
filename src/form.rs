//! The form, drawn from data and wired with one listener.
//!
//! Every field is a row of a table ([`Spec`]): the state field it edits, its label and
//! `data-testid`, and how it is edited. The form is written once as markup from those tables;
//! one `input` and one `change` listener on the form (capture phase) turn edits into state
//! changes; two effects write back what the state changes (the texts and choices, the parts
//! shown for the mode, device and method, the folded sections' notes, each field's message)
//! and touch only what differs. A field costs a row of data instead of a view of its own, and
//! a keystroke re-renders none of the others.
//!
//! The essentials (the model, sequence, batch, precision, optimizer, trainer, training method
//! and the GPUs) are always shown; the rest sits in folded sections ([`Fold`]) whose summary
//! says what in them differs from the defaults, and which open when it does.

use estimator_core::{
    group_thousands, wants_preprocessor, with_preprocessor, AllocatorMode, AttentionKernel,
    BackwardPrefetch, ByteUnit, Checkpointing, Compile, Field, Float8, Fsdp1Sharding, Fsdp1Wrap,
    Generator, Gpu, HubId, Kernels, KvDtype, LossKind, Method, Mode, ModelFamily, ObjectiveKind,
    Offload, Optimizer, OptimizerImpl, Page, PageState, ParamUnit, PipelineSchedule, Precision,
    PrecisionRecipe, Preset, Quant4, Reference, Sharding, TpPlan, Trainer, WeightFormat,
    CUSTOM_MODEL_KEY, PREPROCESSOR_FILE, SIMPLE_OPTIMIZERS,
};
use leptos::{html, prelude::*, task::spawn_local};
use wasm_bindgen::JsCast;

use crate::effect::watch;
use crate::markup::{when, Markup};

/// `(key, label)` choices of a drop-down.
pub type Options = Vec<(&'static str, &'static str)>;

/// Fixed `(key, label)` choices.
type Pairs = &'static [(&'static str, &'static str)];

/// The `(key, label)` pairs of a choice enum's values `$all` (label by `$label`), after the
/// pairs `before` and before the pairs `after`: a table built at compile time, where a
/// generic function building them was compiled once per enum.
macro_rules! pairs {
    ($t:ty, $all:expr, $label:ident) => {
        pairs!($t, $all, $label, [], [])
    };
    ($t:ty, $all:expr, $label:ident, [$($before:expr),*], [$($after:expr),*]) => {{
        const ALL: &[$t] = &$all;
        const BEFORE: Pairs = &[$($before),*];
        const AFTER: Pairs = &[$($after),*];
        const N: usize = BEFORE.len() + ALL.len() + AFTER.len();
        const PAIRS: [(&str, &str); N] = {
            let mut pairs = [("", ""); N];
            let mut i = 0;
            while i < N {
                pairs[i] = if i < BEFORE.len() {
                    BEFORE[i]
                } else if i < BEFORE.len() + ALL.len() {
                    let v = ALL[i - BEFORE.len()];
                    (v.key(), v.$label())
                } else {
                    AFTER[i - BEFORE.len() - ALL.len()]
                };
                i += 1;
            }
            pairs
        };
        &PAIRS
    }};
}

/// How a field is edited.
#[derive(Clone, Copy)]
pub enum Kind {
    /// Typed text with its message: a number (decimal keyboard) unless `text`, with a hint
    /// below (empty for none).
    Typed { hint: &'static str, text: bool },
    /// A drop-down of fixed `(key, label)` choices.
    Choice(Pairs),
    /// A drop-down that other settings may refuse, with the message below it.
    Refusable(Pairs),
}

/// One field of the form.
#[derive(Clone, Copy)]
pub struct Spec {
    /// The state field it edits.
    pub field: Field,
    /// The visible label.
    pub label: &'static str,
    /// `id` and `data-testid` of the control.
    pub testid: &'static str,
    /// How it is edited.
    pub kind: Kind,
}

/// A number field with a hint.
const fn typed(
    field: Field,
    label: &'static str,
    testid: &'static str,
    hint: &'static str,
) -> Spec {
    Spec {
        field,
        label,
        testid,
        kind: Kind::Typed { hint, text: false },
    }
}

/// A drop-down of fixed choices.
const fn choice(field: Field, label: &'static str, testid: &'static str, options: Pairs) -> Spec {
    Spec {
        field,
        label,
        testid,
        kind: Kind::Choice(options),
    }
}

/// The model, the trainer, the sequence and the expert-parallel group: fields with behaviour
/// or texts of their own.
const MODEL: Spec = choice(
    Field::Model,
    "Model",
    "model",
    &[(CUSTOM_MODEL_KEY, "Custom: a Hub id or a config.json")],
);
// The trainer is no field of the state: it names the defaults the inputs have
// (`Source::Trainer`), and a choice applies its defaults.
const TRAINER_CHOICE: Spec = choice(
    Field::Loss,
    "Trainer (sets its defaults below, each still changeable)",
    "trainer",
    pairs!(
        Trainer,
        Trainer::ALL,
        label,
        [],
        [("custom", "Custom (defaults changed below)")]
    ),
);
const SEQ: Spec = typed(
    Field::SeqLen,
    "Sequence length (tokens)",
    "seq",
    "Tokens per sample; for ViT the image side in pixels.",
);
const EXPERT_PARALLEL: Spec = typed(
    Field::ExpertParallel,
    "Expert-parallel GPUs",
    "expert-parallel",
    "",
);

/// The presets under one heading per family, in the order of [`Preset::ALL`].
fn preset_groups() -> Vec<(&'static str, Options)> {
    let mut groups: Vec<(ModelFamily, (&'static str, Options))> = Vec::new();
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

/// A part of the form shown only when the inputs call for it (a `div.when`, hidden
/// otherwise).
#[derive(Clone, Copy, PartialEq)]
enum Shown {
    Simple,
    Architecture,
    CustomModel,
    Training,
    Inference,
    Peft,
    Qlora,
    CpuRam,
    CustomGpu,
    Fsdp2,
    Fsdp1,
    /// FSDP1's `HYBRID_SHARD`: the node's size matters.
    Fsdp1Hybrid,
    DeepSpeed,
    TensorParallel,
    Pipeline,
    /// The sequence length field: supervised training, or inference.
    Sft,
    /// DPO or GRPO.
    Objective,
    Grpo,
    VllmColocated,
    /// Inference served by vLLM: its knobs.
    Serving,
}

impl Shown {
    fn holds(self, s: &PageState) -> bool {
        let trains = s.step.optimizer.trains();
        match self {
            Self::Simple => s.mode == Mode::Simple,
            Self::Architecture => s.mode == Mode::Architecture,
            Self::CustomModel => s.model.preset.is_none(),
            Self::Training => trains,
            Self::Inference => !trains,
            Self::Peft => s.training.method != Method::Full && trains,
            Self::Qlora => s.training.method == Method::Qlora && trains,
            Self::CpuRam => s.hardware.gpu == Some(Gpu::CpuRam),
            Self::CustomGpu => s.hardware.gpu == Some(Gpu::Custom),
            Self::Fsdp2 => s.parallel.sharding == Sharding::Fsdp2,
            Self::Fsdp1 => s.parallel.sharding == Sharding::Fsdp1,
            Self::Fsdp1Hybrid => s.parallel.fsdp1_sharding == Fsdp1Sharding::Hybrid,
            Self::DeepSpeed => matches!(
                s.parallel.sharding,
                Sharding::Zero1 | Sharding::Zero2 | Sharding::Zero3
            ),
            Self::TensorParallel => above_one(&s.parallel.tensor_parallel),
            Self::Pipeline => above_one(&s.parallel.pipeline_parallel),
            Self::Sft => s.step.objective == ObjectiveKind::Sft || !trains,
            Self::Objective => s.step.objective != ObjectiveKind::Sft && trains,
            Self::Grpo => s.step.objective == ObjectiveKind::Grpo && trains,
            Self::Serving => s.serves(),
            Self::VllmColocated => {
                s.step.objective == ObjectiveKind::Grpo
                    && s.step.generator == Generator::VllmColocated
                    && trains
            }
        }
    }
}

/// A folded section of the form (a `details`): closed on a first visit, its summary saying
/// what in it differs from the defaults; it opens when something in it comes to matter (a
/// value other than the default, or more than one GPU for the parallelism), and a person
/// may open or close it at any time.
#[derive(Clone, Copy, PartialEq)]
enum Fold {
    /// The kernels, checkpointing, torch.compile and what the trainer sets.
    Step,
    /// How several GPUs share the step, and the global batch.
    Parallel,
    /// What the device holds beyond the tensors.
    Overheads,
}

impl Fold {
    const fn key(self) -> &'static str {
        match self {
            Self::Step => "step",
            Self::Parallel => "parallel",
            Self::Overheads => "overheads",
        }
    }

    const fn title(self) -> &'static str {
        match self {
            Self::Step => "Kernels, checkpointing and the trainer's settings",
            Self::Parallel => "Parallelism and global batch",
            Self::Overheads => "Memory overheads and the allocator",
        }
    }

    /// Whether it matters for `s`, and its summary's note: the labels of its `controls`
    /// whose values differ from the `defaults` (the step's: from the trainer whose defaults
    /// are nearest).
    fn state(self, s: &PageState, controls: &[Control], defaults: &Defaults) -> (bool, String) {
        let changed = |base: &PageState| -> Vec<&'static str> {
            controls
                .iter()
                .filter(|c| c.source.text(s) != c.source.text(base))
                .map(|c| c.label)
                .collect()
        };
        let changed = if self == Self::Step {
            defaults
                .trainers
                .iter()
                .map(changed)
                .min_by_key(Vec::len)
                .unwrap_or_default()
        } else {
            changed(&defaults.page)
        };
        let several = self == Self::Parallel && above_one(&s.parallel.num_gpus);
        let note = if changed.is_empty() {
            match self {
                Self::Step => "as the trainer sets them".to_owned(),
                _ => "defaults".to_owned(),
            }
        } else {
            format!("changed: {}", changed.join(", "))
        };
        (several || !changed.is_empty(), note)
    }
}

/// The inputs the folded sections compare with: the page's defaults, and those with each
/// trainer's defaults applied (made once: they never change).
struct Defaults {
    page: PageState,
    trainers: Vec<PageState>,
}

impl Defaults {
    fn new() -> Self {
        let page = PageState::default();
        let trainers = Trainer::ALL
            .iter()
            .map(|t| {
                let mut with = page.clone();
                t.apply(&mut with);
                with
            })
            .collect();
        Self { page, trainers }
    }
}

/// Whether a group size as typed is more than one GPU.
fn above_one(text: &str) -> bool {
    text.trim().parse::<u64>().is_ok_and(|n| n > 1)
}

/// Where the text of a control comes from.
#[derive(Clone, Copy, PartialEq)]
enum Source {
    /// A state field's text.
    Field(Field),
    /// The pasted config, as pasted.
    Config,
    /// The trainer whose defaults the inputs have, or `custom`.
    Trainer,
}

impl Source {
    fn text(self, s: &PageState) -> String {
        match self {
            Self::Field(f) => s.get(f).unwrap_or_default(),
            Self::Config => s.model.config_json.clone(),
            Self::Trainer => Trainer::matching(s)
                .map_or("custom", Trainer::key)
                .to_owned(),
        }
    }
}

/// A control of the form: its `id`, where its text comes from, and whether it is a radio
/// group (`id` is then the group's name, each input `{name}-{key}`) or has a message.
struct Control {
    id: &'static str,
    label: &'static str,
    source: Source,
    radios: Option<Pairs>,
    message: bool,
}

/// The form's markup, the conditions of its `div.when` parts in document order, and its
/// controls.
struct Builder<'a> {
    m: Markup,
    state: &'a PageState,
    shown: Vec<Shown>,
    controls: Vec<Control>,
    /// The folded sections and the range of `controls` each holds.
    folds: Vec<(Fold, std::ops::Range<usize>)>,
}

impl<'a> Builder<'a> {
    fn new(state: &'a PageState) -> Self {
        Self {
            m: Markup::default(),
            state,
            shown: Vec::new(),
            controls: Vec::new(),
            folds: Vec::new(),
        }
    }

    /// A folded section around `parts`; the form's effect writes its note and opens it
    /// when it matters, from the first state on.
    fn fold(&mut self, fold: Fold, parts: &dyn Fn(&mut Self)) {
        let first = self.controls.len();
        let id = format!("fold-{}", fold.key());
        let (summary, note) = (format!("{id}-summary"), format!("{id}-note"));
        self.m
            .open(
                "details",
                &[("class", "fold"), ("id", &id), ("data-testid", &id)],
            )
            .open("summary", &[("data-testid", &summary)])
            .text(fold.title())
            .el(
                "span",
                &[
                    ("class", "fold-note"),
                    ("id", &note),
                    ("data-testid", &note),
                ],
                "",
            )
            .close("summary");
        parts(self);
        self.m.close("details");
        self.folds.push((fold, first..self.controls.len()));
    }

    /// A `div.when` around `parts`, hidden unless `shown` holds.
    fn when(&mut self, shown: Shown, parts: &dyn Fn(&mut Self)) {
        self.shown.push(shown);
        self.m.open(
            "div",
            &[
                ("class", "when"),
                (when(!shown.holds(self.state), "hidden"), ""),
            ],
        );
        parts(self);
        self.m.close("div");
    }

    /// `<tag class=...>` around `parts`.
    fn group(&mut self, tag: &str, attrs: &[(&str, &str)], parts: &dyn Fn(&mut Self)) {
        self.m.open(tag, attrs);
        parts(self);
        self.m.close(tag);
    }

    fn fields(&mut self, specs: &[Spec]) {
        for spec in specs {
            self.field(spec, None);
        }
    }

    /// One field of the state; `groups` before a drop-down's options.
    fn field(&mut self, spec: &Spec, groups: Option<Vec<(&'static str, Options)>>) {
        self.control(spec, Source::Field(spec.field), groups);
    }

    /// One control as its component draws it, its text from `source`.
    fn control(
        &mut self,
        spec: &Spec,
        source: Source,
        groups: Option<Vec<(&'static str, Options)>>,
    ) {
        let Spec {
            label,
            testid,
            kind,
            ..
        } = *spec;
        let m = &mut self.m;
        match kind {
            Kind::Typed { hint, text } => {
                let (hint_id, error_id) = (format!("{testid}-hint"), format!("{testid}-error"));
                m.open("div", &[("class", "field")])
                    .el("label", &[("for", testid)], label)
                    .open(
                        "input",
                        &[
                            ("id", testid),
                            ("data-testid", testid),
                            ("type", "text"),
                            ("inputmode", if text { "text" } else { "decimal" }),
                            ("maxlength", "64"),
                            ("autocomplete", "off"),
                            ("spellcheck", "false"),
                            ("aria-invalid", "false"),
                            ("aria-describedby", &hint_id),
                        ],
                    )
                    .el(
                        "span",
                        &[
                            ("class", "hint"),
                            ("id", &hint_id),
                            ("data-testid", &hint_id),
                        ],
                        hint,
                    )
                    .el(
                        "span",
                        &[
                            ("class", "error"),
                            ("id", &error_id),
                            ("data-testid", &error_id),
                            ("role", "alert"),
                        ],
                        "",
                    )
                    .close("div");
            }
            Kind::Choice(options) | Kind::Refusable(options) => {
                let value = source.text(self.state);
                let refusable = matches!(kind, Kind::Refusable(_));
                m.open("div", &[("class", "field")])
                    .el("label", &[("for", testid)], label)
                    .open(
                        "select",
                        &[
                            ("id", testid),
                            ("data-testid", testid),
                            (when(refusable, "aria-invalid"), "false"),
                        ],
                    );
                for (heading, options) in groups.unwrap_or_default() {
                    m.open("optgroup", &[("label", heading)]);
                    option_list(m, &options, &value);
                    m.close("optgroup");
                }
                option_list(m, options, &value);
                m.close("select");
                if refusable {
                    let error_id = format!("{testid}-error");
                    m.el(
                        "span",
                        &[
                            ("class", "error"),
                            ("id", &error_id),
                            ("data-testid", &error_id),
                            ("role", "alert"),
                        ],
                        "",
                    );
                }
                m.close("div");
            }
        }
        self.controls.push(Control {
            id: testid,
            label,
            source,
            radios: None,
            message: matches!(kind, Kind::Typed { .. } | Kind::Refusable(_)),
        });
    }

    /// A fieldset of radio buttons (a [`RadioGroup`](crate::components::RadioGroup)).
    fn radios(&mut self, legend: &'static str, name: &'static str, field: Field, options: Pairs) {
        self.m
            .open(
                "fieldset",
                &[("class", "radio-group"), ("data-testid", name)],
            )
            .el("legend", &[], legend);
        for &(key, text) in options {
            let id = format!("{name}-{key}");
            self.m
                .open("label", &[("class", "radio")])
                .open(
                    "input",
                    &[
                        ("type", "radio"),
                        ("name", name),
                        ("id", &id),
                        ("data-testid", &id),
                        ("value", key),
                    ],
                )
                .text(text)
                .close("label");
        }
        self.m.close("fieldset");
        self.controls.push(Control {
            id: name,
            label: legend,
            source: Source::Field(field),
            radios: Some(options),
            message: false,
        });
    }

    /// The model's `config.json`: fetched from the Hub by its id on a click, pasted or
    /// uploaded.
    fn config(&mut self) {
        self.m
            .open("div", &[("class", "field")])
            .el("label", &[("for", "hub-id")], "Hugging Face Hub id")
            .open("div", &[("class", "field-row")])
            .open(
                "input",
                &[
                    ("id", "hub-id"),
                    ("data-testid", "hub-id"),
                    ("type", "text"),
                    ("maxlength", "400"),
                    ("autocomplete", "off"),
                    ("spellcheck", "false"),
                    ("placeholder", "owner/name@revision"),
                    ("aria-describedby", "hub-hint hub-error"),
                ],
            )
            .el(
                "button",
                &[
                    ("type", "button"),
                    ("id", "hub-fetch"),
                    ("data-testid", "hub-fetch"),
                    ("class", "secondary"),
                ],
                "Fetch",
            )
            .close("div")
            .el(
                "span",
                &[("class", "hint"), ("id", "hub-hint")],
                "Its config.json, read from huggingface.co on your click only; no token is sent.",
            )
            .el(
                "span",
                &[
                    ("class", "error"),
                    ("id", "hub-error"),
                    ("data-testid", "hub-error"),
                    ("role", "alert"),
                ],
                "",
            )
            .close("div")
            .open("div", &[("class", "field")])
            .el("label", &[("for", "config-json")], "config.json")
            .el(
                "textarea",
                &[
                    ("id", "config-json"),
                    ("data-testid", "config-json"),
                    ("spellcheck", "false"),
                    ("placeholder", "Paste a Hugging Face config.json"),
                    ("aria-invalid", "false"),
                    ("aria-describedby", "config-json-hint config-json-error"),
                ],
                "",
            )
            .el(
                "span",
                &[
                    ("class", "hint"),
                    ("id", "config-json-hint"),
                    ("data-testid", "config-json-types"),
                ],
                &format!(
                    "Supported model_type values: {}.",
                    ModelFamily::supported_model_types()
                ),
            )
            .el(
                "label",
                &[("for", "config-file"), ("class", "file-label")],
                "…or upload the file",
            )
            .open(
                "input",
                &[
                    ("id", "config-file"),
                    ("data-testid", "config-file"),
                    ("type", "file"),
                    ("accept", ".json,application/json"),
                ],
            )
            .el(
                "span",
                &[
                    ("class", "error"),
                    ("id", "config-json-error"),
                    ("data-testid", "config-json-error"),
                    ("role", "alert"),
                ],
                "",
            )
            .close("div");
        self.controls.push(Control {
            id: "config-json",
            label: "config.json",
            source: Source::Config,
            radios: None,
            message: false,
        });
    }

    /// The optimizer field of the mode the page is in: each mode has its own list, and only
    /// one may be in the page.
    fn optimizer(&mut self, mode: Mode) {
        if self.state.mode == mode {
            self.field(optimizer_spec(mode), None);
        }
    }
}

/// `<option>`s, `value` selected.
fn option_list(m: &mut Markup, options: &[(&'static str, &'static str)], value: &str) {
    for &(key, text) in options {
        m.el(
            "option",
            &[("value", key), (when(key == value, "selected"), "")],
            text,
        );
    }
}

fn optimizer_spec(mode: Mode) -> &'static Spec {
    match mode {
        Mode::Simple => &SIMPLE_OPTIMIZER[0],
        Mode::Architecture => &OPTIMIZER[0],
    }
}

/// The whole form as markup for `state`, with its parts' conditions and its controls.
fn build(state: &PageState) -> Builder<'_> {
    let mut b = Builder::new(state);
    b.m.el("h2", &[("id", "inputs-title")], "Model and training step");
    b.radios(
        "Describe the model",
        "mode",
        Field::Mode,
        pairs!(Mode, Mode::ALL, label),
    );
    b.when(Shown::Simple, &|b| {
        b.group("div", &[("class", "field-row")], &|b| b.fields(PARAMS));
        b.fields(PRECISION);
        b.optimizer(Mode::Simple);
    });
    b.when(Shown::Architecture, &|b| {
        b.field(&MODEL, Some(preset_groups()));
        b.when(Shown::CustomModel, &Builder::config);
        b.when(Shown::Sft, &|b| b.field(&SEQ, None));
        // a vision-language model's images: shown by the page's effect once the config says so
        b.group(
            "fieldset",
            &[
                ("class", "vision"),
                ("id", "vision-settings"),
                ("data-testid", "vision-settings"),
                ("hidden", ""),
            ],
            &|b| {
                b.m.el("legend", &[], "Images (vision-language model)");
                b.fields(VISION);
                b.m.el(
                    "p",
                    &[
                        ("class", "hint"),
                        ("id", "image-tokens"),
                        ("data-testid", "image-tokens"),
                    ],
                    "",
                );
            },
        );
        b.fields(RECIPE);
        b.optimizer(Mode::Architecture);
        b.when(Shown::Training, &|b| {
            b.control(&TRAINER_CHOICE, Source::Trainer, None)
        });
        b.when(Shown::Training, &|b| b.fields(OBJECTIVE));
        b.when(Shown::Objective, &|b| {
            b.group(
                "fieldset",
                &[
                    ("class", "objective"),
                    ("data-testid", "objective-settings"),
                ],
                &|b| {
                    b.m.el("legend", &[], "DPO / GRPO (TRL 1.16)");
                    b.fields(OBJECTIVE_SETTINGS);
                    b.when(Shown::Grpo, &|b| b.fields(GRPO));
                    b.when(Shown::VllmColocated, &|b| b.fields(VLLM));
                },
            );
        });
        b.when(Shown::Training, &|b| b.fields(METHOD));
        b.when(Shown::Peft, &|b| {
            b.group(
                "fieldset",
                &[("class", "peft"), ("data-testid", "peft-settings")],
                &|b| {
                    b.m.el("legend", &[], "LoRA adapters (peft)");
                    b.fields(LORA);
                    b.when(Shown::Qlora, &|b| b.fields(QLORA));
                },
            );
        });
        b.when(Shown::Inference, &|b| b.fields(INFERENCE));
        b.when(Shown::Serving, &|b| {
            b.group(
                "fieldset",
                &[("class", "serving"), ("data-testid", "serve-settings")],
                &|b| {
                    b.m.el("legend", &[], "vLLM server (v0.11.0), per GPU");
                    b.fields(SERVE);
                },
            );
        });
    });
    b.fields(BATCH);
    b.when(Shown::Simple, &|b| b.fields(ACTIVATION_MB));
    b.when(Shown::Architecture, &|b| {
        b.fold(Fold::Step, &|b| {
            b.when(Shown::Training, &|b| {
                b.fields(OPTIMIZER_IMPL);
                // why the kernel means nothing for the optimizer chosen, if it does not
                b.m.el(
                    "p",
                    &[
                        ("class", "hint"),
                        ("id", "optimizer-impl-note"),
                        ("data-testid", "optimizer-impl-note"),
                    ],
                    "",
                );
            });
            b.fields(KERNEL);
            b.when(Shown::Training, &|b| b.fields(COMPILE));
            b.when(Shown::Training, &|b| b.fields(TRAINER));
        });
    });
    b.m.el("h3", &[("class", "section-title")], "Hardware");
    b.fields(GPU);
    b.when(Shown::CpuRam, &|b| b.fields(RAM));
    b.when(Shown::CustomGpu, &|b| b.fields(CUSTOM_GPU));
    b.fold(Fold::Parallel, &|b| {
        b.fields(DATA_PARALLEL);
        b.when(Shown::Architecture, &|b| {
            b.when(Shown::Fsdp2, &|b| b.fields(FSDP2));
            b.when(Shown::Fsdp1, &|b| {
                b.fields(FSDP1);
                b.when(Shown::Fsdp1Hybrid, &|b| b.fields(FSDP1_HYBRID));
            });
            b.when(Shown::DeepSpeed, &|b| b.fields(DEEPSPEED));
            b.fields(TENSOR_PARALLEL);
            b.when(Shown::TensorParallel, &|b| b.fields(TENSOR_PARALLEL_MORE));
            b.fields(CONTEXT_PIPELINE);
            b.when(Shown::Pipeline, &|b| b.fields(PIPELINE_MORE));
            b.field(&EXPERT_PARALLEL, None);
        });
        b.fields(GLOBAL_BATCH);
    });
    b.fold(Fold::Overheads, &|b| {
        b.group("div", &[("class", "overheads")], &|b| b.fields(OVERHEADS));
        b.fields(ALLOCATOR);
    });
    b.radios(
        "Show figures in",
        "unit",
        Field::ByteUnit,
        pairs!(ByteUnit, ByteUnit::ALL, label),
    );
    b
}

/// The element of `id`, if it is in the page.
fn by_id(id: &str) -> Option<web_sys::Element> {
    document().get_element_by_id(id)
}

/// Sets the `value` of an input, select or text area.
fn set_value(el: &web_sys::Element, value: &str) {
    if let Some(input) = el.dyn_ref::<web_sys::HtmlInputElement>() {
        input.set_value(value);
    } else if let Some(select) = el.dyn_ref::<web_sys::HtmlSelectElement>() {
        select.set_value(value);
    } else if let Some(area) = el.dyn_ref::<web_sys::HtmlTextAreaElement>() {
        area.set_value(value);
    }
}

/// Shows `message` at the field of `id` (`None`: valid): the text below it, `aria-invalid`,
/// what the input is described by, and the field's `invalid` class.
fn show_message(id: &str, message: Option<&str>) {
    let Some(input) = by_id(id) else { return };
    let invalid = message.is_some();
    let _ = input.set_attribute("aria-invalid", if invalid { "true" } else { "false" });
    if id == "config-json" {
        // the text area is described by its hint and its message at once
    } else if invalid {
        let _ = input.set_attribute("aria-describedby", &format!("{id}-error"));
    } else if input.tag_name() == "SELECT" {
        // a drop-down has no hint
        let _ = input.remove_attribute("aria-describedby");
    } else {
        let _ = input.set_attribute("aria-describedby", &format!("{id}-hint"));
    }
    if let Some(field) = input.parent_element() {
        let _ = field.class_list().toggle_with_force("invalid", invalid);
    }
    if let Some(error) = by_id(&format!("{id}-error")) {
        error.set_text_content(Some(message.unwrap_or_default()));
    }
}

/// Reads the file chosen in the file input `input` into the config.
fn read_config(input: &web_sys::Element, state: RwSignal<PageState>) {
    let Some(file) = input
        .dyn_ref::<web_sys::HtmlInputElement>()
        .and_then(web_sys::HtmlInputElement::files)
        .and_then(|files| files.get(0))
    else {
        return;
    };
    spawn_local(async move {
        let text = wasm_bindgen_futures::JsFuture::from(file.text())
            .await
            .ok()
            .and_then(|t| t.as_string())
            .unwrap_or_default();
        state.update(|s| {
            let _ = s.set(Field::Config, &text);
        });
    });
}

/// Fetches the `config.json` of the Hub id typed in `hub-id` (and a vision-language model's
/// `preprocessor_config.json`) and makes it the model; says why not in `hub-error`. The button waits, disabled, for the answer.
fn fetch_hub(button: web_sys::Element, state: RwSignal<PageState>) {
    let show = |message: &str| {
        if let Some(error) = by_id("hub-error") {
            error.set_text_content(Some(message));
        }
    };
    let typed = by_id("hub-id")
        .and_then(|i| i.dyn_into::<web_sys::HtmlInputElement>().ok())
        .map(|i| i.value())
        .unwrap_or_default();
    let id = match HubId::parse(&typed) {
        Ok(id) => id,
        Err(why) => return show(&why.to_string()),
    };
    show("");
    let _ = button.set_attribute("disabled", "");
    spawn_local(async move {
        let mut answer = crate::browser::fetch_config(&id.config_url(), true).await;
        if let Ok(config) = &mut answer {
            // a vision-language model's processor sizes, where its repository has them (the
            // sizes the checkpoints publish otherwise)
            if wants_preprocessor(config) {
                let url = id.file_url(PREPROCESSOR_FILE);
                let file = crate::browser::fetch_config(&url, false).await;
                if let Some(joined) = file.ok().and_then(|p| with_preprocessor(config, &p)) {
                    *config = joined;
                }
            }
        }
        let _ = button.remove_attribute("disabled");
        match answer {
            Ok(text) => state.update(|s| {
                s.model.preset = None;
                let _ = s.set(Field::Config, &text);
            }),
            Err(why) => show(&format!("{id}: {why}")),
        }
    });
}

/// The form over `state`: edits change the state, and the form follows the state and
/// `page`'s messages.
pub fn input_form(state: RwSignal<PageState>, page: Memo<Page>) -> impl IntoView {
    let (markup, shown, controls, folds) = state.with_untracked(|s| {
        let b = build(s);
        (b.m.finish(), b.shown, b.controls, b.folds)
    });
    let form = NodeRef::<html::Form>::new();
    let count = controls.len();
    let controls = StoredValue::new(controls);

    // The state's changes, written into the form where they differ from what it shows (what
    // it shows: the effect's own variables).
    let mut texts = vec![None::<String>; count];
    let mut parts = vec![None::<bool>; shown.len()];
    let mut fold_states = vec![None::<(bool, String)>; folds.len()];
    let defaults = Defaults::new();
    let mut mode = None::<Mode>;
    let mut kernel_note = None::<Option<&'static str>>;
    watch(move || {
        let Some(form) = form.get() else { return };
        state.with(|s| {
            // the optimizer kernel, disabled with a note for an optimizer that runs its own
            let ignored = s.step.optimizer.ignores_implementation();
            if kernel_note != Some(ignored) {
                kernel_note = Some(ignored);
                if let Some(note) = by_id("optimizer-impl-note") {
                    let text = ignored.map(|why| format!("No effect: {why}."));
                    note.set_text_content(text.as_deref());
                }
                if let Some(select) = by_id("optimizer-impl") {
                    let _ = select.toggle_attribute_with_force("disabled", ignored.is_some());
                    let _ = select.set_attribute("aria-describedby", "optimizer-impl-note");
                }
            }
            // the optimizer field of the mode
            let previous = mode.replace(s.mode);
            if previous.is_some_and(|m| m != s.mode) {
                if let Some(old) = by_id("optimizer").and_then(|o| o.parent_element()) {
                    old.remove();
                }
                let anchor = if s.mode == Mode::Simple {
                    "precision"
                } else {
                    "recipe"
                };
                if let Some(anchor) = by_id(anchor).and_then(|a| a.parent_element()) {
                    let mut b = Builder::new(s);
                    b.field(optimizer_spec(s.mode), None);
                    let _ = anchor.insert_adjacent_html("afterend", &b.m.finish());
                }
            }
            // the parts shown (their wrappers looked up on the first change only: most
            // keystrokes change none)
            let mut wrappers = None;
            for (i, (part, was)) in shown.iter().zip(&mut parts).enumerate() {
                let now = part.holds(s);
                if *was != Some(now) {
                    *was = Some(now);
                    if let Some(el) = wrappers
                        .get_or_insert_with(|| form.query_selector_all("div.when").ok())
                        .as_ref()
                        .and_then(|w| w.item(i as u32))
                        .and_then(|n| n.dyn_into::<web_sys::Element>().ok())
                    {
                        let _ = el.toggle_attribute_with_force("hidden", !now);
                    }
                }
            }
            // the folded sections' notes; a section opens when it comes to matter
            controls.with_value(|controls| {
                for ((fold, range), was) in folds.iter().zip(&mut fold_states) {
                    let controls = controls.get(range.clone()).unwrap_or_default();
                    let now = fold.state(s, controls, &defaults);
                    if was.as_ref() == Some(&now) {
                        continue;
                    }
                    let key = fold.key();
                    if was.as_ref().map(|w| &w.1) != Some(&now.1) {
                        if let Some(note) = by_id(&format!("fold-{key}-note")) {
                            note.set_text_content(Some(&now.1));
                        }
                    }
                    if now.0 && !was.as_ref().is_some_and(|w| w.0) {
                        if let Some(details) = by_id(&format!("fold-{key}")) {
                            let _ = details.set_attribute("open", "");
                        }
                    }
                    *was = Some(now);
                }
            });
            // the texts and choices
            controls.with_value(|controls| {
                for (control, was) in controls.iter().zip(&mut texts) {
                    let now = control.source.text(s);
                    if was.as_deref() == Some(now.as_str()) {
                        continue;
                    }
                    match control.radios {
                        Some(radios) => {
                            for &(key, _) in radios {
                                if let Some(radio) = by_id(&format!("{}-{key}", control.id))
                                    .and_then(|r| r.dyn_into::<web_sys::HtmlInputElement>().ok())
                                {
                                    radio.set_checked(key == now);
                                }
                            }
                        }
                        None => {
                            if let Some(el) = by_id(control.id) {
                                set_value(&el, &now);
                            }
                        }
                    }
                    *was = Some(now);
                }
            });
        });
    });

    // The messages, and the texts that follow the model.
    let mut messages = Vec::<(&'static str, String)>::new();
    let mut model_texts = None::<(bool, bool, bool)>;
    let mut image_tokens = String::new();
    watch(move || {
        if form.get().is_none() {
            return;
        }
        page.with(|p| {
            let mut now: Vec<(&'static str, String)> = p
                .field_errors
                .iter()
                .filter_map(|(f, e)| {
                    // the message of a field the form shows with one
                    controls.with_value(|c| {
                        c.iter()
                            .find(|c| c.message && c.source == Source::Field(*f))
                            .map(|c| (c.id, e.clone()))
                    })
                })
                .collect();
            // the first message of a field is the one shown
            let mut seen = Vec::new();
            now.retain(|(id, _)| {
                let first = !seen.contains(id);
                seen.push(*id);
                first
            });
            if let Some(e) = &p.config_error {
                now.push(("config-json", e.clone()));
            }
            for (id, _) in &messages {
                if !now.iter().any(|(i, _)| i == id) {
                    show_message(id, None);
                }
            }
            for (id, e) in &now {
                if !messages.iter().any(|(i, w)| i == id && w == e) {
                    show_message(id, Some(e));
                }
            }
            messages = now;
            let tokens = p.image_tokens.map_or_else(String::new, |t| {
                format!(
                    "{} image tokens per sample; the language model's sequence: {} tokens.",
                    group_thousands(t.image_tokens.saturating_add(t.markup_tokens)),
                    group_thousands(t.sequence)
                )
            });
            if image_tokens != tokens {
                if let Some(el) = by_id("image-tokens") {
                    el.set_text_content(Some(&tokens));
                }
                image_tokens = tokens;
            }
            let texts = (p.is_vision, p.is_moe, p.is_vision_language);
            if model_texts != Some(texts) {
                model_texts = Some(texts);
                if let Some(images) = by_id("vision-settings") {
                    let _ = images.toggle_attribute_with_force("hidden", !p.is_vision_language);
                }
                if let Some(label) = form.get().and_then(|f| f.query_selector("label[for=seq]").ok().flatten()) {
                    label.set_text_content(Some(if p.is_vision {
                        "Image size (pixels per side)"
                    } else if p.is_vision_language {
                        // the images' tokens come on top (the line under the image fields)
                        "Text tokens per sample"
                    } else {
                        "Sequence length (tokens)"
                    }));
                }
                if let Some(hint) = by_id("expert-parallel-hint") {
                    hint.set_text_content(Some(if p.is_moe {
                        "Splits the routed experts across the group; must divide the number of GPUs."
                    } else {
                        "This model has no experts: no effect."
                    }));
                }
            }
        });
    });

    // Edits: text as it is typed, choices once made.
    let edit = move |ev: web_sys::Event, typing: bool| {
        let Some(target) = ev
            .target()
            .and_then(|t| t.dyn_into::<web_sys::Element>().ok())
        else {
            return;
        };
        let text_input = target.tag_name() == "TEXTAREA"
            || target.get_attribute("type").as_deref() == Some("text");
        if text_input != typing {
            return;
        }
        let id = target.id();
        match id.as_str() {
            "config-file" => return read_config(&target, state),
            // the Hub id is read on the button's click only
            "hub-id" => return,
            _ => {}
        }
        let value = event_target_value(&ev);
        if id == "trainer" && Trainer::from_key(&value).is_none() {
            // "Custom" names no defaults to apply
            return;
        }
        state.update(|s| {
            // A choice from a list is always valid; a too-long text is refused by maxlength.
            let _ = match id.as_str() {
                "trainer" => {
                    if let Some(t) = Trainer::from_key(&value) {
                        t.apply(s);
                    }
                    Ok(())
                }
                "model" => s.set(Field::Model, &value).map(|()| {
                    if let Some(preset) = s.model.preset {
                        s.step.seq_len = preset.default_seq_len().to_string();
                    }
                }),
                "config-json" => s.set(Field::Config, &value),
                _ => match target.get_attribute("name").as_deref() {
                    Some("mode") => s.set(Field::Mode, &value),
                    Some("unit") => s.set(Field::ByteUnit, &value),
                    _ => match controls
                        .with_value(|c| c.iter().find(|c| c.id == id).map(|c| c.source))
                    {
                        Some(Source::Field(field)) => s.set(field, &value),
                        _ => Ok(()),
                    },
                },
            };
        });
    };

    view! {
        <form class="card inputs" aria-labelledby="inputs-title" node_ref=form inner_html=markup
            on:submit=|ev| ev.prevent_default()
            on:input:capture=move |ev| edit(ev, true)
            on:change:capture=move |ev| edit(ev, false)
            on:click=move |ev| {
                if let Some(button) = ev
                    .target()
                    .and_then(|t| t.dyn_into::<web_sys::Element>().ok())
                    .filter(|t| t.id() == "hub-fetch")
                {
                    fetch_hub(button, state);
                }
            }></form>
    }
}
/// Simple mode: the parameters and their unit, side by side.
pub const PARAMS: &[Spec] = &[
    typed(
        Field::Params,
        "Model parameters",
        "params",
        "Decimals allowed: 0.5 with B is 500 million.",
    ),
    choice(
        Field::ParamsUnit,
        "Unit",
        "params-unit",
        pairs!(ParamUnit, ParamUnit::ALL, label),
    ),
];

/// Simple mode: the precision.
pub const PRECISION: &[Spec] = &[choice(
    Field::Precision,
    "Numerical precision",
    "precision",
    pairs!(Precision, Precision::ALL, label),
)];

/// Simple mode's optimizers.
pub const SIMPLE_OPTIMIZER: &[Spec] = &[choice(
    Field::Optimizer,
    "Optimizer",
    "optimizer",
    pairs!(Optimizer, SIMPLE_OPTIMIZERS, label),
)];

/// Architecture mode: the precision recipe.
pub const RECIPE: &[Spec] = &[choice(
    Field::Recipe,
    "Precision recipe",
    "recipe",
    pairs!(PrecisionRecipe, PrecisionRecipe::ALL, label),
)];

/// Architecture mode's optimizers.
pub const OPTIMIZER: &[Spec] = &[choice(
    Field::Optimizer,
    "Optimizer",
    "optimizer",
    pairs!(Optimizer, Optimizer::ALL, label),
)];

/// How torch.optim runs the optimizer (training only).
pub const OPTIMIZER_IMPL: &[Spec] = &[choice(
    Field::OptimizerImpl,
    "Optimizer kernel",
    "optimizer-impl",
    pairs!(OptimizerImpl, OptimizerImpl::ALL, label),
)];

/// The attention kernel and checkpointing.
pub const KERNEL: &[Spec] = &[
    choice(
        Field::Attention,
        "Attention kernel",
        "attention",
        pairs!(AttentionKernel, AttentionKernel::ALL, label),
    ),
    choice(
        Field::Checkpointing,
        "Activation checkpointing",
        "checkpointing",
        pairs!(Checkpointing, Checkpointing::ALL, label),
    ),
];

/// `torch.compile` (training only): off, each block (the loss eager or compiled), or the whole
/// model.
pub const COMPILE: &[Spec] = &[
    choice(
        Field::Compile,
        "torch.compile",
        "compile",
        pairs!(Compile, Compile::ALL, label),
    ),
    choice(
        Field::Float8,
        "float8 training (torchao)",
        "float8",
        pairs!(Float8, Float8::ALL, label),
    ),
];

/// What the trainer sets (training only).
pub const TRAINER: &[Spec] = &[
    choice(
        Field::Loss,
        "Loss (trainer)",
        "loss",
        pairs!(LossKind, LossKind::ALL, label),
    ),
    choice(
        Field::Packing,
        "Sequence packing",
        "packing",
        &[
            ("off", "Off: one sample per row"),
            ("on", "On: documents packed, position ids restart"),
        ],
    ),
    choice(
        Field::OptimizerInBackward,
        "Optimizer step",
        "optimizer-in-backward",
        &[
            ("off", "After backward (all gradients kept)"),
            ("on", "In backward (torchtune's optimizer_in_bwd)"),
        ],
    ),
    choice(
        Field::Kernels,
        "Layer kernels (LoRA, QLoRA)",
        "kernels",
        pairs!(Kernels, Kernels::ALL, label),
    ),
    choice(
        Field::ActivationOffload,
        "Activation offloading",
        "activation-offload",
        &[
            ("off", "Off"),
            ("on", "On: saved tensors in CPU memory (torchtune)"),
        ],
    ),
    choice(
        Field::Padding,
        "Padded rows",
        "padding",
        &[
            ("off", "Off: every token real (the mask is dropped)"),
            ("on", "On: padding in the attention mask"),
        ],
    ),
];

/// The training objective (training only).
pub const OBJECTIVE: &[Spec] = &[choice(
    Field::Objective,
    "Training objective",
    "objective",
    pairs!(ObjectiveKind, ObjectiveKind::ALL, label),
)];

/// DPO's and GRPO's sequences and reference.
pub const OBJECTIVE_SETTINGS: &[Spec] = &[
    typed(
        Field::MaxPrompt,
        "Prompt tokens",
        "max-prompt",
        "DPO: the batch counts pairs (two rows each).",
    ),
    typed(
        Field::MaxCompletion,
        "Completion tokens",
        "max-completion",
        "",
    ),
    choice(
        Field::Reference,
        "Reference model",
        "reference",
        pairs!(Reference, Reference::ALL, label),
    ),
];

/// GRPO's generation.
pub const GRPO: &[Spec] = &[
    typed(
        Field::Generations,
        "Generations per prompt",
        "generations",
        "num_generations: the batch counts prompts.",
    ),
    choice(
        Field::Generator,
        "Generator",
        "generator",
        pairs!(Generator, Generator::ALL, label),
    ),
];

/// Colocated vLLM's share of the device.
pub const VLLM: &[Spec] = &[typed(
    Field::VllmMemory,
    "vLLM gpu_memory_utilization",
    "vllm-memory",
    "",
)];

/// A vision-language model's images and what trains of its vision side.
pub const VISION: &[Spec] = &[
    typed(
        Field::Images,
        "Images per sample",
        "images",
        "0: a text-only batch (the tower and projector weights still on the GPU).",
    ),
    Spec {
        field: Field::ImageSize,
        label: "Image size (width x height, pixels)",
        testid: "image-size",
        kind: Kind::Typed {
            hint: "Resized as the model's processor does.",
            text: true,
        },
    },
    choice(
        Field::VisionTower,
        "Vision tower",
        "vision-tower",
        &[("frozen", "Frozen"), ("trained", "Trained")],
    ),
    choice(
        Field::Projector,
        "Projector",
        "projector",
        &[("trained", "Trained"), ("frozen", "Frozen")],
    ),
];

/// The training method (training only).
pub const METHOD: &[Spec] = &[choice(
    Field::Method,
    "Training method",
    "method",
    pairs!(Method, Method::ALL, label),
)];

/// LoRA's adapters.
pub const LORA: &[Spec] = &[
    typed(Field::LoraRank, "Rank r", "lora-rank", ""),
    typed(
        Field::LoraAlpha,
        "lora_alpha",
        "lora-alpha",
        "Scales the adapters' output (alpha / r): no effect on memory.",
    ),
    typed(
        Field::LoraDropout,
        "lora_dropout",
        "lora-dropout",
        "Above 0, every adapted linear keeps a dropout mask.",
    ),
    Spec {
        field: Field::LoraTargets,
        label: "Target modules",
        testid: "lora-targets",
        kind: Kind::Typed {
            hint: "all-linear, attention, mlp, or module names such as q_proj,v_proj.",
            text: true,
        },
    },
    choice(
        Field::LoraDtype,
        "Adapter dtype",
        "lora-dtype",
        &[
            ("fp32", "fp32 (peft's default)"),
            ("model", "The base model's dtype"),
        ],
    ),
    choice(
        Field::BaseDtype,
        "Base weights loaded in",
        "base-dtype",
        &[
            ("recipe", "The precision's dtype"),
            ("fp32", "fp32 (torch_dtype=float32)"),
        ],
    ),
];

/// QLoRA's quantization.
pub const QLORA: &[Spec] = &[
    choice(
        Field::Quant,
        "4-bit type (bitsandbytes)",
        "quant",
        pairs!(Quant4, Quant4::ALL, key),
    ),
    choice(
        Field::DoubleQuant,
        "Double quantization",
        "double-quant",
        &[("on", "On"), ("off", "Off")],
    ),
    choice(
        Field::KbitPrepare,
        "prepare_model_for_kbit_training",
        "kbit-prepare",
        &[("on", "On: unquantized weights in fp32"), ("off", "Off")],
    ),
];

/// Inference: the generated tokens and how weights and cache are stored.
pub const INFERENCE: &[Spec] = &[
    typed(
        Field::NewTokens,
        "Generated tokens (KV cache)",
        "new-tokens",
        "Tokens generated after the prompt; 0 for a single forward pass.",
    ),
    choice(
        Field::WeightFormat,
        "Weight format",
        "weight-format",
        pairs!(WeightFormat, WeightFormat::ALL, label),
    ),
    choice(
        Field::KvDtype,
        "KV-cache dtype",
        "kv-dtype",
        pairs!(KvDtype, KvDtype::ALL, label),
    ),
    choice(
        Field::Serve,
        "Serve with vLLM",
        "serve",
        &[
            ("off", "Off: one batch's KV cache"),
            ("on", "On: the KV cache vLLM sizes at start-up"),
        ],
    ),
];

/// vLLM's knobs (v0.11.0), per GPU of its tensor-parallel group.
pub const SERVE: &[Spec] = &[
    typed(
        Field::GpuMemoryUtilization,
        "gpu_memory_utilization",
        "gpu-memory-utilization",
        "The fraction of the whole device vLLM may take.",
    ),
    typed(
        Field::MaxModelLen,
        "max_model_len",
        "max-model-len",
        "Tokens per request; empty: the model's context.",
    ),
    typed(
        Field::MaxNumSeqs,
        "max_num_seqs",
        "max-num-seqs",
        "Requests per step; empty: vLLM's default for the GPU.",
    ),
    typed(
        Field::MaxNumBatchedTokens,
        "max_num_batched_tokens",
        "max-num-batched-tokens",
        "Tokens per step; empty: vLLM's default for the GPU.",
    ),
    choice(
        Field::EnforceEager,
        "CUDA graphs",
        "enforce-eager",
        &[("off", "Captured (default)"), ("on", "enforce_eager: none")],
    ),
    choice(
        Field::FlashinferSampler,
        "Sampler",
        "sampler",
        &[
            ("off", "PyTorch's top-k/top-p sort (pip install vllm)"),
            ("on", "FlashInfer (vLLM's Docker image)"),
        ],
    ),
];

/// The batch.
pub const BATCH: &[Spec] = &[typed(
    Field::Batch,
    "Batch size",
    "batch",
    "Samples per step (per GPU), a whole number.",
)];

/// Simple mode: the activations of one sample.
pub const ACTIVATION_MB: &[Spec] = &[typed(
    Field::ActivationMb,
    "Activation memory per sample (MB)",
    "act-mb",
    "Intermediate tensors one sample keeps for backward, in MB (10⁶ bytes).",
)];

/// The device and how many.
pub const GPU: &[Spec] = &[
    choice(
        Field::Gpu,
        "GPU",
        "gpu",
        pairs!(Gpu, Gpu::ALL, label, [("none", "No GPU in particular")], []),
    ),
    typed(
        Field::NumGpus,
        "GPUs in all",
        "num-gpus",
        "A multiple of tensor x context x pipeline parallel; the rest is data parallel.",
    ),
];

/// The CPU's RAM, when the device is the CPU.
pub const RAM: &[Spec] = &[typed(
    Field::RamCapacity,
    "CPU RAM (GiB)",
    "ram-gib",
    "The computer's memory; inference on the CPU has no CUDA context.",
)];

/// A custom device's capacity.
pub const CUSTOM_GPU: &[Spec] = &[typed(
    Field::CustomCapacity,
    "Custom capacity (MiB)",
    "gpu-capacity",
    "Total memory as nvidia-smi reports it.",
)];

/// PyTorch's caching allocator, whose reserve the step's replay finds.
pub const ALLOCATOR: &[Spec] = &[choice(
    Field::Allocator,
    "PyTorch's caching allocator (PYTORCH_CUDA_ALLOC_CONF)",
    "allocator",
    pairs!(AllocatorMode, AllocatorMode::ALL, label),
)];

/// What the device holds beyond the tensors.
pub const OVERHEADS: &[Spec] = &[
    typed(Field::CudaContext, "CUDA context (MiB)", "cuda-context", ""),
    typed(
        Field::AllocatorReserve,
        "Allocator reserve (%)",
        "allocator-reserve",
        "Empty: what the caching allocator reserves, the step replayed through it.",
    ),
    typed(
        Field::SafetyMargin,
        "Safety margin (%)",
        "safety-margin",
        "Kept free for what the estimate does not see: cuBLAS workspaces (tens of MiB), the CUDA context's variation by driver, a display or another process, fragmentation across streams. Default 5%.",
    ),
];

/// Data parallelism: the engine, offloading and NCCL's buffers.
pub const DATA_PARALLEL: &[Spec] = &[
    choice(Field::Sharding, "Data-parallel engine", "sharding", pairs!(Sharding, Sharding::ALL, label)),
    Spec {
        field: Field::Offload,
        label: "Offload to CPU",
        testid: "offload",
        kind: Kind::Refusable(pairs!(Offload, Offload::ALL, label)),
    },
    typed(
        Field::NcclMib,
        "NCCL buffers per communicator (MiB)",
        "nccl-mib",
        "Outside PyTorch's allocator; default 512: NCCL_BUFFSIZE 4 MiB x 32 channels x 2 peers x 2.",
    ),
];

/// Architecture mode: FSDP2's resharding and units.
pub const FSDP2: &[Spec] = &[
    choice(
        Field::ReshardAfterForward,
        "FSDP2 reshard after forward",
        "reshard-after-forward",
        &[
            ("on", "On: each layer re-gathered for backward"),
            ("off", "Off: gathered layers kept until backward"),
            ("2", "To 2 GPUs"),
            ("4", "To 4 GPUs"),
            ("8", "To 8 GPUs (a node)"),
        ],
    ),
    // (refused without tensorwise scaling: the message shows below it)
    Spec {
        field: Field::Float8AllGather,
        label: "FSDP2 float8 all-gather",
        testid: "float8-all-gather",
        kind: Kind::Refusable(&[
            ("off", "Off: weights gathered in bf16"),
            ("on", "On: float8 weights gathered a byte each (tensorwise)"),
        ]),
    },
    choice(
        Field::ShardEmbeddings,
        "Embeddings and head as FSDP units",
        "shard-embeddings",
        &[
            ("off", "Off: in the root, gathered through the step"),
            (
                "on",
                "On: gathered while they run (torchtune's custom_sharded_layers)",
            ),
        ],
    ),
];

/// Architecture mode: FSDP1 as accelerate wraps a model (its defaults first).
pub const FSDP1: &[Spec] = &[
    choice(
        Field::Fsdp1Sharding,
        "FSDP1 sharding strategy",
        "fsdp1-sharding",
        pairs!(Fsdp1Sharding, Fsdp1Sharding::ALL, label),
    ),
    choice(
        Field::Fsdp1Wrap,
        "FSDP1 auto wrap policy",
        "fsdp1-wrap",
        pairs!(Fsdp1Wrap, Fsdp1Wrap::ALL, label),
    ),
    choice(
        Field::BackwardPrefetch,
        "FSDP1 backward prefetch",
        "backward-prefetch",
        pairs!(BackwardPrefetch, BackwardPrefetch::ALL, label),
    ),
    choice(
        Field::UseOrigParams,
        "FSDP1 use_orig_params",
        "use-orig-params",
        &[
            ("on", "On (the HF Trainer's)"),
            ("off", "Off (accelerate's default)"),
        ],
    ),
];

/// Architecture mode: FSDP1's `HYBRID_SHARD` shard group.
pub const FSDP1_HYBRID: &[Spec] = &[typed(
    Field::GpusPerNode,
    "GPUs per node",
    "gpus-per-node",
    "HYBRID_SHARD shards within a node and replicates across nodes.",
)];

/// Architecture mode: DeepSpeed's buckets.
pub const DEEPSPEED: &[Spec] = &[
    typed(
        Field::ReduceBucket,
        "DeepSpeed reduce bucket (elements)",
        "reduce-bucket",
        "reduce_bucket_size; DeepSpeed's default 5e8.",
    ),
    typed(
        Field::PrefetchBucket,
        "DeepSpeed ZeRO-3 prefetch bucket (elements)",
        "prefetch-bucket",
        "stage3_prefetch_bucket_size; DeepSpeed's default 5e7.",
    ),
];

/// Architecture mode: the tensor-parallel group.
pub const TENSOR_PARALLEL: &[Spec] = &[typed(
    Field::TensorParallel,
    "Tensor parallelism (GPUs per group)",
    "tensor-parallel",
    "torchtitan's plan: heads, MLP and vocabulary split; norms and the residual stream whole.",
)];

/// Architecture mode: what a tensor-parallel group of 2+ GPUs also splits.
pub const TENSOR_PARALLEL_MORE: &[Spec] = &[
    choice(
        Field::SequenceParallel,
        "Sequence parallelism",
        "sequence-parallel",
        &[
            ("off", "Off"),
            ("on", "On: norms and residuals on a slice of the tokens"),
        ],
    ),
    choice(
        Field::TpPlan,
        "Tensor-parallel plan",
        "tp-plan",
        pairs!(TpPlan, TpPlan::ALL, label),
    ),
    choice(
        Field::LossParallel,
        "Loss parallelism",
        "loss-parallel",
        &[
            ("off", "Off: logits gathered whole on every GPU"),
            ("on", "On: loss on each GPU's vocabulary slice"),
        ],
    ),
];

/// Architecture mode: context and pipeline parallelism.
pub const CONTEXT_PIPELINE: &[Spec] = &[
    typed(
        Field::ContextParallel,
        "Context parallelism (GPUs per group)",
        "context-parallel",
        "Ring attention: the sequence split over the group.",
    ),
    typed(
        Field::PipelineParallel,
        "Pipeline stages",
        "pipeline-parallel",
        "Layers split into stages; the figures are the busiest stage's GPU.",
    ),
];

/// Architecture mode: how a pipeline of 2+ stages runs.
pub const PIPELINE_MORE: &[Spec] = &[
    choice(
        Field::PipelineSchedule,
        "Pipeline schedule",
        "pipeline-schedule",
        pairs!(PipelineSchedule, PipelineSchedule::ALL, label),
    ),
    typed(
        Field::Microbatches,
        "Micro-batches per step",
        "microbatches",
        "Through the pipeline, each of the batch size above; empty: one per stage.",
    ),
];

/// The global batch reached with accumulation.
pub const GLOBAL_BATCH: &[Spec] = &[typed(
    Field::GlobalBatch,
    "Target global batch (optional)",
    "global-batch",
    "Samples per optimizer step, reached with gradient accumulation.",
)];
