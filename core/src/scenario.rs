//! The page's inputs parsed once: text as typed in, one validated scenario out.
//!
//! Every keystroke changes the [`PageState`] (the text as typed, which links must keep
//! exactly); [`parse_page`] turns it into a [`Page`] once per change: the field errors, the
//! model's notes and what the form needs to know of the model, and the typed [`Scenario`]
//! that evaluation and the advisor read. Nothing downstream parses text again, and the
//! advisor varies the typed scenario, never text.

use crate::advisor::advise_parsed;
use crate::evaluate::{evaluate_parsed, parse_all, Knobs, Parsed};
use crate::state::{Mode, PageState, PlanInputs};
use crate::{Evaluation, EvaluationError, Field, FitPlan, Method};

/// A validated scenario: the model (parsed, counted once), the step, the training method
/// and the hardware plan.
#[derive(Clone, Debug, PartialEq)]
pub struct Scenario {
    plan: PlanInputs,
    parsed: Parsed,
    knobs: Knobs,
    /// vLLM serving, when it is on: the device as its worker sees it and its settings.
    serve: Option<crate::ServeInputs>,
}

/// What serving reads of a scenario: the model, the device, vLLM's settings.
type Served<'a> = (
    &'a crate::Architecture,
    crate::ServeDevice,
    crate::VllmSettings,
);

/// The scenario of parsed inputs and `state`'s vLLM settings, the errors of both together.
fn scenario_of(
    state: &PageState,
    parsed: Result<(PlanInputs, Parsed, Knobs), EvaluationError>,
) -> Result<Scenario, EvaluationError> {
    match (parsed, state.vllm_inputs()) {
        (Ok((plan, parsed, knobs)), Ok(serve)) => Ok(Scenario {
            plan,
            parsed,
            knobs,
            serve,
        }),
        (Err(EvaluationError::Fields(mut a)), Err(b)) => {
            a.extend(b);
            Err(EvaluationError::Fields(a))
        }
        (Ok(_), Err(b)) => Err(EvaluationError::Fields(b)),
        (Err(e), _) => Err(e),
    }
}

impl Scenario {
    /// The scenario of `state` alone, without what only the page shows (field errors of
    /// fields that do not count, notes): what [`evaluate`](crate::evaluate), the advisor and
    /// the CLI read.
    ///
    /// # Errors
    /// Invalid fields or an unusable model.
    pub fn parse(state: &PageState) -> Result<Self, EvaluationError> {
        scenario_of(state, parse_all(state, None))
    }

    /// The model, the device and vLLM's settings with the plan's tensor-parallel size, when
    /// serving is on (`None` when it is off); why not, in the simple mode.
    fn served(&self) -> Option<Result<Served<'_>, (Field, String)>> {
        let (device, settings) = self.serve?;
        let (tp, ep) = (self.plan.tensor_parallel, self.plan.expert_parallel);
        let settings = crate::VllmSettings {
            tensor_parallel: tp,
            expert_parallel: ep > 1,
            ..settings
        };
        Some(match &self.parsed {
            // vLLM's expert parallelism spans its tensor-parallel group (EP = TP x DP, one
            // server here)
            Parsed::Architecture(model) if ep > 1 && ep != tp && model.arch.is_moe() => Err((
                Field::ExpertParallel,
                format!(
                    "vLLM spreads the experts over its tensor-parallel group: 1 (off) or {tp}."
                ),
            )),
            Parsed::Architecture(model) => Ok((&model.arch, device, settings)),
            Parsed::Simple { .. } => Err((
                Field::Mode,
                "Serving is sized from the model's layers: pick a preset or paste a config.json."
                    .to_owned(),
            )),
        })
    }

    /// What vLLM's start-up makes of the model on the chosen GPU, when serving is on
    /// (`None` when it is off), with the plan's tensor-parallel size.
    ///
    /// # Errors
    /// The field vLLM would refuse, and why.
    #[must_use]
    pub fn serve(&self) -> Option<Result<crate::Serving, (Field, String)>> {
        self.served().map(|served| {
            served.and_then(|(arch, device, settings)| crate::serve_vllm(arch, device, &settings))
        })
    }

    /// Every figure the page shows (what [`evaluate`](crate::evaluate) returns).
    ///
    /// # Errors
    /// A step that cannot be estimated (a sequence too long, a figure too large).
    pub fn evaluate(&self) -> Result<Evaluation, EvaluationError> {
        if let Some(why) = self.serving_only() {
            return Err(EvaluationError::Model(why.to_owned()));
        }
        evaluate_parsed(&self.plan, &self.parsed, &self.knobs)
    }

    /// Why the model is sized for serving only (a hybrid's linear attention), if it is: no
    /// step, advice or sweep is estimated for it.
    fn serving_only(&self) -> Option<&'static str> {
        match &self.parsed {
            Parsed::Architecture(model) => model.arch.serving_only(),
            Parsed::Simple { .. } => None,
        }
    }

    /// The configurations that fit, best first (what [`fit_advice`](crate::fit_advice)
    /// returns); `state` is the text the plans' links change.
    ///
    /// # Errors
    /// No device chosen, or a step that cannot be estimated.
    pub fn advise(&self, state: &PageState, limit: usize) -> Result<Vec<FitPlan>, EvaluationError> {
        if let Some(why) = self.serving_only() {
            return Err(EvaluationError::Model(why.to_owned()));
        }
        advise_parsed(state, &self.plan, &self.parsed, self.knobs, limit)
    }

    /// The longest sequence that fits at the typed batch (in its accumulation passes), by
    /// the largest batch's verdicts: a bisection over multiples of [`SEQ_STEP`] tokens
    /// (DPO and GRPO: of the completion, the prompt held), the answer held to its own
    /// allocator replay and the next length's. `None` without a GPU, in the simple mode and
    /// for an image model. A few dozen estimates and a few replays: the page asks once the
    /// inputs rest.
    ///
    /// [`SEQ_STEP`]: crate::SEQ_STEP
    #[must_use]
    pub fn longest_sequence(&self) -> Option<crate::LongestSequence> {
        if self.serving_only().is_some() {
            return None;
        }
        crate::evaluate::longest_sequence(&self.plan, &self.parsed, &self.knobs)
    }

    /// The sweep over sequence lengths at the typed batch: powers of two around the typed
    /// length and the typed length, each row's [`tokens`](crate::SweepRow::tokens) its
    /// whole sequence; a row fits when it is no longer than `longest` (from
    /// [`Self::longest_sequence`]). Empty in the simple mode and for an image model.
    #[must_use]
    pub fn sequence_sweep(&self, longest: Option<&crate::LongestSequence>) -> Vec<crate::SweepRow> {
        if self.serving_only().is_some() {
            return Vec::new();
        }
        crate::evaluate::sequence_sweep(&self.plan, &self.parsed, &self.knobs, longest)
    }

    /// What to change so that vLLM starts, when `now` ([`Self::serve`]'s start-up) cannot
    /// hold one request, each with `state` so changed (what its link opens).
    #[must_use]
    pub fn serve_advice(
        &self,
        state: &PageState,
        now: &crate::Serving,
    ) -> Vec<(crate::ServeChange, PageState)> {
        let Some(Ok((arch, device, settings))) = self.served() else {
            return Vec::new();
        };
        crate::serve_advice(arch, device, &settings, now)
            .into_iter()
            .map(|a| {
                let mut changed = state.clone();
                for (field, value) in &a.changes {
                    let _ = changed.set(*field, value);
                }
                (a, changed)
            })
            .collect()
    }

    /// The planning inputs (device, overheads, GPUs, sharding, global batch).
    #[must_use]
    pub fn plan(&self) -> &PlanInputs {
        &self.plan
    }
}

/// What the page shows for one [`PageState`], parsed once.
#[derive(Clone, Debug, PartialEq)]
pub struct Page {
    /// The scenario, or why there is none (field errors, an unusable model).
    pub scenario: Result<Scenario, EvaluationError>,
    /// The message of each field whose text does not parse, shown next to it. Target
    /// module names are checked against the model.
    pub field_errors: Vec<(Field, String)>,
    /// Why the pasted config cannot be used (architecture mode, custom model).
    pub config_error: Option<String>,
    /// What the estimate of the chosen model leaves out or assumes (architecture mode).
    pub notes: Vec<&'static str>,
    /// Architecture mode: whether the model is a mixture of experts.
    pub is_moe: bool,
    /// Architecture mode: whether the model takes images (the sequence is an image side).
    pub is_vision: bool,
    /// Architecture mode: whether the model is a vision-language model (images beside the
    /// text: the image fields are its inputs, the sequence its text tokens).
    #[cfg(feature = "vision")]
    pub is_vision_language: bool,
    /// Architecture mode, a vision-language model with images: the tokens of one sample.
    #[cfg(feature = "vision")]
    pub image_tokens: Option<crate::ImageTokens>,
    /// Architecture mode, a mixture of experts: the parameters one token runs through.
    pub active_params: Option<u64>,
}

/// Parses `state` once into everything the page reads.
#[must_use]
pub fn parse_page(state: &PageState) -> Page {
    let arch = (state.mode == Mode::Architecture).then(|| state.architecture());
    let model = arch.as_ref().and_then(|a| a.as_ref().ok());
    let mut field_errors: Vec<(Field, String)> = state
        .invalid_text_fields()
        .into_iter()
        .map(|(f, e)| (f, e.to_string()))
        .collect();
    if let Some(a) = model.filter(|_| state.training.method != Method::Full) {
        if let Err(errors) = state.parsed_peft(a) {
            field_errors.extend(
                errors
                    .into_iter()
                    .filter(|(f, _)| *f == Field::LoraTargets)
                    .map(|(f, e)| (f, e.to_string())),
            );
        }
    }
    // the image fields are a vision-language model's inputs only
    #[cfg(feature = "vision")]
    let mut image_tokens = None;
    #[cfg(feature = "vision")]
    match model.map(|a| (a, state.parsed_vision(a))) {
        Some((_, Err(errors))) => {
            field_errors.extend(errors.into_iter().map(|(f, e)| (f, e.to_string())));
        }
        Some((a, Ok(Some(v)))) if v.images > 0 => {
            // (the estimate says why an image does not fit the processor)
            image_tokens = state
                .parsed_seq_len()
                .ok()
                .and_then(|text| crate::image_tokens(a, text, &v).ok());
        }
        _ => {}
    }
    let config_error = match (&arch, state.model.preset) {
        (None, _) | (_, Some(_)) => None,
        (Some(_), None) if state.model.config_json.trim().is_empty() => {
            Some("Paste a config.json, upload one, or pick a preset.".to_owned())
        }
        (Some(parsed), None) => parsed.as_ref().err().map(ToString::to_string),
    };
    let scenario = scenario_of(state, parse_all(state, arch.as_ref()));
    let fsdp2_pipeline = scenario
        .as_ref()
        .is_ok_and(|s| s.plan.pipeline_parallel > 1 && s.plan.sharding == crate::Sharding::Fsdp2);
    Page {
        scenario,
        field_errors,
        config_error,
        notes: model
            .map(|a| {
                let mut notes = a.notes().to_vec();
                if !a.is_causal_lm() && state.step.loss != crate::LossKind::Hf {
                    notes.push(NOT_A_CAUSAL_LM_LOSS);
                }
                if state.step.compile != crate::Compile::Off
                    && !matches!(
                        a.family(),
                        crate::ModelFamily::Llama
                            | crate::ModelFamily::Qwen3
                            | crate::ModelFamily::Gpt2
                            | crate::ModelFamily::Mistral
                            | crate::ModelFamily::Phi3
                            | crate::ModelFamily::Gemma3
                            | crate::ModelFamily::Qwen3Moe
                    )
                {
                    notes.push(COMPILE_MEASURED_ON);
                }
                if state.training.method != crate::Method::Full
                    && state.parallel.offload != crate::Offload::None
                {
                    notes.push(OFFLOAD_WITH_ADAPTERS);
                }
                if state.step.float8 != crate::Float8::Off && state.step.optimizer.trains() {
                    notes.push(FLOAT8_CASTS);
                }
                if state.step.kernels != crate::Kernels::Torch {
                    notes.push(UNSLOTH_DERIVED);
                }
                if fsdp2_pipeline && state.step.optimizer.trains() {
                    notes.push(FSDP2_UNDER_A_PIPELINE);
                }
                notes
            })
            .unwrap_or_default(),
        is_moe: model.is_some_and(crate::Architecture::is_moe),
        is_vision: model.is_some_and(crate::Architecture::is_vision),
        #[cfg(feature = "vision")]
        is_vision_language: model.is_some_and(crate::Architecture::is_vision_language),
        #[cfg(feature = "vision")]
        image_tokens,
        active_params: model
            .filter(|a| a.is_moe())
            .map(crate::Architecture::active_parameter_count),
    }
}

/// Said when FSDP2 shards the stages of a pipeline.
const FSDP2_UNDER_A_PIPELINE: &str = "Under a pipeline, torch's stages turn FSDP2's gradient sync off until the last micro-batch: each stage keeps its gradients unsharded (in fp32 under the mixed recipes) through the whole step, and its layers gathered after their backward (measured on a fake process group: validation/DISTRIBUTED.md).";

/// Said when a trainer's loss is chosen for a model that does not predict the next token.
const NOT_A_CAUSAL_LM_LOSS: &str = "The trainers' losses are for next-token prediction: this model keeps its own loss (masked-LM or classification), whatever the Loss field says.";

/// Said when a model outside the measured families is compiled.
const COMPILE_MEASURED_ON: &str = "torch.compile is modelled from Llama, Qwen3, GPT-2, Mistral, Phi-3, Gemma 3 and Qwen3-MoE measurements (validation/COMPILE.md): this model's norms, activations, residual adds, experts and loss follow the same rules; its other parts (other routers, eager attention, other heads) keep eager's.";

/// Said when CPU offload is asked for with LoRA or QLoRA: measured under FSDP1 only, the
/// rest read from the engines' sources, and a derived figure must say so.
const OFFLOAD_WITH_ADAPTERS: &str = "CPU offload with LoRA or QLoRA was measured under FSDP1 (a fake process group); under FSDP2 and DeepSpeed it is read from their sources: the base's shards, the adapters' gradients and optimizer in host RAM, only what is gathered on the GPU.";

/// Said with Unsloth's kernels: derived from its source; its Triton kernels do not run here.
const UNSLOTH_DERIVED: &str = "Unsloth's kernels are derived from its source (validation/UNSLOTH.md), and its 2024.12 PyTorch code measured on the CPU with stand-ins for its Triton kernels, not on a GPU. Its 2026 loss, a chunked cross-entropy sized from free memory, is counted as Cut Cross-Entropy.";

/// Said with float8 training: what its casts hold is measured, not modelled.
const FLOAT8_CASTS: &str = "float8 training (torchao 0.18, measured on the fake mode: validation/FLOAT8.md) saves what bf16 saves and holds no more state; FSDP2's float8 all-gather halves the gathered layers. The casts inside each linear (eager: about 9 bytes per element of the tensor cast, fused away by torch.compile) are left out of these figures: they stayed under the loss's peak in every measured step.";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{decode_query, evaluate, fit_advice};

    #[test]
    fn vllm_s_expert_parallelism_spans_its_tensor_parallel_group() {
        let serve = |q: &str| {
            parse_page(&decode_query(q).state)
                .scenario
                .expect("a scenario")
                .serve()
                .expect("serving")
        };
        let base = "m=arch&model=qwen3-30b-a3b&o=none&gpu=h100-80&srv=on&tp=2";
        assert!(serve(&format!("{base}&gpus=2&ep=2")).is_ok());
        // (the training rule, EP dividing the data-parallel GPUs, is not vLLM's)
        let wrong = serve(&format!("{base}&gpus=4&ep=4"));
        assert_eq!(wrong.map(|_| ()).unwrap_err().0, Field::ExpertParallel);
        // a dense model ignores it, as vLLM does
        assert!(
            serve("m=arch&model=llama3.1-8b&o=none&gpu=h100-80&srv=on&tp=2&gpus=4&ep=4").is_ok()
        );
    }

    #[test]
    fn offload_with_adapters_says_how_it_is_known() {
        let notes = |q: &str| parse_page(&decode_query(q).state).notes;
        let base = "m=arch&model=llama3-70b&gpus=8&shard=fsdp2";
        assert!(notes(&format!("{base}&method=lora&off=optimizer%2Bparams"))
            .contains(&OFFLOAD_WITH_ADAPTERS));
        assert!(!notes(&format!("{base}&off=optimizer%2Bparams")).contains(&OFFLOAD_WITH_ADAPTERS));
        assert!(!notes(&format!("{base}&method=lora")).contains(&OFFLOAD_WITH_ADAPTERS));
    }

    #[test]
    fn fsdp2_under_a_pipeline_says_its_gradients_stay_unsharded() {
        let notes = |q: &str| parse_page(&decode_query(q).state).notes;
        let base = "m=arch&model=llama3.2-1b&gpus=4&mb=4";
        assert!(notes(&format!("{base}&shard=fsdp2&pp=2")).contains(&FSDP2_UNDER_A_PIPELINE));
        assert!(!notes(&format!("{base}&shard=fsdp2")).contains(&FSDP2_UNDER_A_PIPELINE));
        assert!(!notes(&format!("{base}&shard=ddp&pp=2")).contains(&FSDP2_UNDER_A_PIPELINE));
        assert!(
            !notes(&format!("{base}&shard=fsdp2&pp=2&o=none")).contains(&FSDP2_UNDER_A_PIPELINE)
        );
    }

    #[test]
    fn compile_is_noted_outside_the_measured_families() {
        let page = |q: &str| parse_page(&decode_query(q).state);
        assert!(page("m=arch&model=mixtral-8x7b&comp=layers")
            .notes
            .contains(&COMPILE_MEASURED_ON));
        assert!(!page("m=arch&model=mixtral-8x7b")
            .notes
            .contains(&COMPILE_MEASURED_ON));
        assert!(!page("m=arch&model=qwen3-0.6b&comp=model")
            .notes
            .contains(&COMPILE_MEASURED_ON));
        assert!(!page("m=arch&model=gemma3-1b&comp=layers")
            .notes
            .contains(&COMPILE_MEASURED_ON));
    }

    #[test]
    fn the_compile_setting_round_trips_through_the_url() {
        use crate::{encode_query, Compile};
        assert_eq!(decode_query("").state.step.compile, Compile::Off);
        assert_eq!(decode_query("m=arch").state.step.compile, Compile::Off);
        for c in Compile::ALL {
            let d = decode_query(&format!("m=arch&comp={}", c.key()));
            assert!(d.notices.is_empty());
            assert_eq!(d.state.step.compile, c);
            let again = decode_query(&encode_query(&d.state));
            assert_eq!(again.state.step.compile, c);
            assert_eq!(Compile::from_key(c.key()), Some(c));
        }
        assert!(!decode_query("comp=jit").notices.is_empty());
        // the step the page evaluates is compiled
        let peak = |q: &str| {
            evaluate(&decode_query(q).state)
                .expect("evaluates")
                .step
                .peak_bytes
        };
        assert!(peak("m=arch&model=llama3.2-1b&comp=layers") < peak("m=arch&model=llama3.2-1b"));
    }

    #[test]
    fn a_trainers_loss_on_bert_is_noted() {
        let page = |q: &str| parse_page(&decode_query(q).state);
        let bert = page("m=arch&model=bert-base&loss=liger");
        assert!(bert.notes.contains(&NOT_A_CAUSAL_LM_LOSS));
        assert!(!page("m=arch&model=bert-base")
            .notes
            .contains(&NOT_A_CAUSAL_LM_LOSS));
        assert!(!page("m=arch&model=qwen3-0.6b&loss=liger")
            .notes
            .contains(&NOT_A_CAUSAL_LM_LOSS));
    }

    /// The parsed page gives what the text-reading functions give, for both modes, valid
    /// and not.
    #[test]
    fn parsing_once_changes_no_figure() {
        for query in [
            "",
            "p=13&pu=B&b=4&a=0&gpu=a100-80",
            "m=arch&model=llama3-8b&gpu=rtx4090&b=1&s=2048",
            "m=arch&model=qwen3-30b-a3b&gpu=h200&n=8&ep=8&shard=zero1",
            "m=arch&model=llama3-8b&method=qlora&o=paged-adamw8bit&gc=full&gpu=rtx4090",
            "m=arch&model=llama3-8b&method=lora&lt=c_attn",
            "m=arch&model=gpt2&b=x",
        ] {
            let state = decode_query(query).state;
            let page = parse_page(&state);
            let direct = evaluate(&state);
            assert_eq!(
                page.scenario
                    .as_ref()
                    .map_err(Clone::clone)
                    .and_then(Scenario::evaluate),
                direct,
                "{query}"
            );
            if let Ok(s) = &page.scenario {
                assert_eq!(s.advise(&state, 6), fit_advice(&state, 6), "{query}");
            }
        }
    }

    /// A vision-language config: its image fields are checked, a text model's are not.
    #[cfg(feature = "vision")]
    #[test]
    fn the_page_knows_a_vision_language_model() {
        let page = parse_page(&decode_query("m=arch&model=vit-b16").state);
        assert!(page.is_vision && !page.is_vision_language);
        let mut vlm = decode_query("m=arch&isz=12x&img=2").state;
        vlm.model.preset = None;
        vlm.model.config_json =
            include_str!("../../validation/configs/smolvlm2-500m.json").to_owned();
        let page = parse_page(&vlm);
        assert!(page.is_vision_language && !page.is_vision);
        assert!(page
            .field_errors
            .iter()
            .any(|(f, _)| *f == Field::ImageSize));
        let page = parse_page(&decode_query("m=arch&model=llama3-8b&isz=12x&img=2").state);
        assert!(page.field_errors.is_empty() && !page.is_vision_language);
    }

    #[test]
    fn the_page_knows_the_model() {
        let page = parse_page(&decode_query("m=arch&model=qwen3-30b-a3b").state);
        assert!(page.is_moe && !page.is_vision);
        assert_eq!(page.active_params, Some(3_353_032_704));
        let page = parse_page(&decode_query("m=arch&model=vit-b16").state);
        assert!(page.is_vision);
        let page = parse_page(&decode_query("m=arch&model=llama3-8b&method=lora&lt=c_attn").state);
        assert!(page
            .field_errors
            .iter()
            .any(|(f, e)| *f == Field::LoraTargets && e.contains("c_attn")));
        let page = parse_page(&{
            let mut page_state = decode_query("m=arch").state;
            page_state.model.preset = None;
            page_state
        });
        assert_eq!(
            page.config_error.as_deref(),
            Some("Paste a config.json, upload one, or pick a preset.")
        );
        assert!(page.scenario.is_err());
        // simple mode reads no model
        let page = parse_page(&{
            let mut page_state = PageState::default();
            page_state.model.preset = None;
            page_state
        });
        assert!(page.config_error.is_none() && page.notes.is_empty());
    }
}
