//! A vision-language model's images in the evaluation (the `vision` feature): the step with
//! its vision tower, the parameters it adds, the image fields' errors.

use super::{Evaluation, Knobs, Parsed};
use crate::state::{Field, PageState};
use crate::{Architecture, FieldError, Objective, PeakEstimate, TrainingStep, VisionInputs};

/// A parsed input, or its fields' errors.
type Parsing<T> = Result<T, Vec<(Field, FieldError)>>;

/// The objective parsed, and the images of a vision-language model: the image fields'
/// errors join the objective's (after them), so that every field's error shows at once.
pub(super) fn with_images(
    state: &PageState,
    arch: &Architecture,
    objective: Parsing<Objective>,
) -> (Parsing<Objective>, Option<VisionInputs>) {
    match (objective, state.parsed_vision(arch)) {
        (Ok(o), Ok(v)) => (Ok(o), v),
        (o, v) => (
            Err(o.err().into_iter().chain(v.err()).flatten().collect()),
            None,
        ),
    }
}

/// Whether the step is the whole vision-language model's ([`crate::estimate_vlm`]'s): always
/// with images; on a text-only batch, for supervised fine-tuning or inference on data
/// parallelism (DPO, GRPO and the splits of the step are modelled for the language model
/// alone, on text).
fn whole_model_step(objective: &Objective, splits: bool, vision: &VisionInputs) -> bool {
    vision.images > 0 || (objective.kind == crate::ObjectiveKind::Sft && !splits)
}

/// The step of one rank's whole model: a vision-language model's (supervised fine-tuning
/// or inference; data parallelism shards it above, the splits of the step and DPO / GRPO
/// are modelled for the text models only, and on a text-only batch give the language
/// model's step); another model's, the text model's.
pub(super) fn step(
    arch: &Architecture,
    step: &TrainingStep,
    peft: Option<&crate::Peft>,
    mesh: &crate::Mesh,
    objective: &Objective,
    vision: Option<&VisionInputs>,
) -> Result<PeakEstimate, crate::EstimateError> {
    let Some(vision) = vision.filter(|v| whole_model_step(objective, mesh.splits_the_step(), v))
    else {
        return crate::estimate_objective(arch, step, peft, mesh, objective, None);
    };
    if objective.kind != crate::ObjectiveKind::Sft {
        return Err(crate::EstimateError::ImagesInvalid(
            "DPO and GRPO are modelled for text only: with images, pick supervised fine-tuning",
        ));
    }
    if mesh.splits_the_step() {
        return Err(crate::EstimateError::MeshUnsupported(
            "with images, the step is modelled on data parallelism only (no tensor, context or pipeline parallelism)",
        ));
    }
    crate::estimate_vlm(arch, step, peft, vision)
}

/// `e` with the vision side among a vision-language model's parameters: the tower and the
/// projector, and of what trains only the adapters counted as the text model's (the vision
/// side's trained parts are already among them when the step was the whole model's).
pub(super) fn with_vision_parameters(
    mut e: Evaluation,
    parsed: &Parsed,
    knobs: &Knobs,
) -> Evaluation {
    let (Parsed::Architecture(m), Some(v)) = (parsed, knobs.vision) else {
        return e;
    };
    let plan = &e.plan;
    let splits =
        plan.tensor_parallel > 1 || plan.context_parallel > 1 || plan.pipeline_parallel > 1;
    let vision_trainable = if whole_model_step(&knobs.objective, splits, &v) {
        m.arch.vision_trainable_count(&v)
    } else {
        0
    };
    let adapters = if knobs.peft.is_some() {
        e.step.trainable_params.saturating_sub(vision_trainable)
    } else {
        0
    };
    e.n_params = parsed
        .n_params()
        .saturating_add(adapters)
        .saturating_add(m.arch.vision_parameter_count());
    e
}

#[cfg(test)]
mod tests {
    use super::super::evaluate;
    use super::*;
    use crate::{
        decode_query, AttentionKernel, Checkpointing, Compile, EvaluationError, LossKind,
        Optimizer, OptimizerImpl, PrecisionRecipe,
    };

    /// A vision-language config with its images: the page's evaluation is `estimate_vlm`'s
    /// step, its parameters include the tower; the same config without a vision side's
    /// fields keeps the text model's figures; bad image fields are field errors.
    #[test]
    fn a_vision_language_model_is_evaluated_with_its_images() {
        let config = include_str!("../../../validation/configs/qwen2.5-vl-7b-4l.json");
        let mut state = decode_query("m=arch&model=custom&b=1&s=256&r=bf16&oi=foreach").state;
        state.hardware.gpu = None;
        state.model.preset = None;
        state.model.config_json = config.to_owned();
        state.vision.images = "2".to_owned();
        state.vision.image_size = "1344x896".to_owned();
        let e = evaluate(&state).unwrap();
        let arch = crate::parse_hf_config(config).unwrap();
        let step = TrainingStep {
            batch: 1,
            seq_len: 256,
            precision: PrecisionRecipe::Bf16,
            optimizer: Optimizer::AdamW,
            optimizer_impl: OptimizerImpl::Foreach,
            attention: AttentionKernel::Sdpa,
            checkpointing: Checkpointing::None,
            compile: Compile::Off,
            loss: LossKind::Hf,
            packing: false,
            padding: false,
            optimizer_in_backward: false,
            activation_offload: false,
            micro_batches: 1,
            kernels: crate::Kernels::Torch,
        };
        let images = crate::VisionInputs::new(2, 1344, 896);
        let direct = crate::estimate_vlm(&arch, &step, None, &images).unwrap();
        assert_eq!(e.step.peak_bytes, direct.peak_bytes);
        assert_eq!(e.n_params, direct.n_params);
        assert!(e.n_params > arch.parameter_count());
        // no images (the default): a text-only batch, the tower and projector idle on the
        // GPU (their weights counted, nothing else of theirs)
        state.vision.images = crate::DEFAULT_IMAGES.to_owned();
        let none = evaluate(&state).unwrap();
        assert!(none.step.peak_bytes < e.step.peak_bytes);
        assert_eq!(
            none.n_params,
            arch.parameter_count() + arch.vision_parameter_count()
        );
        let text_only = crate::estimate_peak(&arch, &step).unwrap();
        let idle = crate::estimate_vlm(&arch, &step, None, &crate::VisionInputs::new(0, 1024, 768))
            .unwrap();
        assert_eq!(none.step.peak_bytes, idle.peak_bytes);
        assert!(idle.peak_bytes > text_only.peak_bytes);
        // DPO on a text-only batch: the language model's step, as before (the vision side
        // is modelled with supervised fine-tuning only), the tower among the parameters
        let mut dpo = state.clone();
        dpo.step.objective = crate::ObjectiveKind::Dpo;
        let d = evaluate(&dpo).unwrap();
        assert_eq!(d.n_params, none.n_params);
        state.vision.images = "x".to_owned();
        state.vision.image_size = "10x".to_owned();
        match evaluate(&state) {
            Err(EvaluationError::Fields(f)) => {
                let fields: Vec<Field> = f.iter().map(|(f, _)| *f).collect();
                assert_eq!(fields, [Field::Images, Field::ImageSize]);
            }
            other => panic!("{other:?}"),
        }
        // a text model ignores the image fields
        let text = decode_query("m=arch&model=llama3.2-1b&img=4&isz=1x").state;
        assert!(evaluate(&text).is_ok());
    }
}
