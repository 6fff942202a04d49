//! Peak memory of one training step, tensor by tensor (see the module docs in `mod.rs`).

use super::config::Architecture;
use super::model::{Kernel, StepShape};
use super::ops::{add, mul, storage, sum_storages, Dtypes, PartBytes, Res, SavedPart, BLOCK};
use super::recipe::{AttentionKernel, Checkpointing, PrecisionRecipe};
use crate::Optimizer;
use std::fmt;

/// One training (or inference) step to estimate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TrainingStep {
    /// Samples per step.
    pub batch: u64,
    /// Tokens per sample; for ViT, the image side in pixels (224 for 224 x 224).
    pub seq_len: u64,
    /// Precision recipe.
    pub precision: PrecisionRecipe,
    /// Optimizer; [`Optimizer::None`] is inference under `no_grad`.
    pub optimizer: Optimizer,
    /// Attention kernel.
    pub attention: AttentionKernel,
    /// Activation checkpointing.
    pub checkpointing: Checkpointing,
}

/// A phase of the step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// The forward pass (and loss).
    Forward,
    /// The backward pass.
    Backward,
    /// `optimizer.step()`.
    OptimizerStep,
}

impl Phase {
    /// Short stable key.
    #[must_use]
    pub const fn key(self) -> &'static str {
        match self {
            Phase::Forward => "fwd",
            Phase::Backward => "bwd",
            Phase::OptimizerStep => "opt",
        }
    }
    /// Name shown to a person.
    #[must_use]
    pub const fn label(self) -> &'static str {
        match self {
            Phase::Forward => "Forward",
            Phase::Backward => "Backward",
            Phase::OptimizerStep => "Optimizer step",
        }
    }
}

/// Bytes alive at one moment, by category.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CategoryBytes {
    /// Weights.
    pub parameters: u64,
    /// Module buffers and the input batch.
    pub buffers: u64,
    /// Parameter gradients.
    pub gradients: u64,
    /// Optimizer state (moments, momentum, step counters, fp32 master weights).
    pub optimizer_states: u64,
    /// Tensors saved for backward (including autocast's 16-bit weight copies).
    pub activations: u64,
    /// Short-lived buffers: loss gradients, the optimizer's foreach temporary, etc.
    pub temporaries: u64,
}

impl CategoryBytes {
    /// The sum, or `None` on overflow.
    #[must_use]
    pub fn total(&self) -> Option<u64> {
        [
            self.buffers,
            self.gradients,
            self.optimizer_states,
            self.activations,
            self.temporaries,
        ]
        .into_iter()
        .try_fold(self.parameters, u64::checked_add)
    }
}

/// The estimate of one step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeakEstimate {
    /// Parameters of the model.
    pub n_params: u64,
    /// Peak allocated bytes (`torch.cuda.max_memory_allocated()`).
    pub peak_bytes: u64,
    /// The phase where the peak happens.
    pub peak_phase: Phase,
    /// What is alive at the peak.
    pub at_peak: CategoryBytes,
    /// The peak of each phase that runs.
    pub phase_peaks: Vec<(Phase, CategoryBytes)>,
    /// Bytes saved by the forward for backward (alive at its end).
    pub saved_activation_bytes: u64,
    /// What those bytes are for (in inference: the forward's working set), summing to the
    /// activations of the forward phase.
    pub saved_parts: Vec<(SavedPart, u64)>,
}

/// Why a step cannot be estimated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EstimateError {
    /// Batch size 0.
    ZeroBatch,
    /// Sequence length (or image side) 0.
    ZeroSeqLen,
    /// The model has learned position embeddings and cannot take longer sequences.
    SeqLenTooLong {
        /// The longest sequence the model accepts.
        max: u64,
    },
    /// A ViT takes images of exactly its configured side (its position embeddings are learned).
    ImageSizeMismatch {
        /// The configured image side in pixels.
        expected: u64,
    },
    /// A byte count does not fit in 64 bits.
    TooLarge,
}

impl fmt::Display for EstimateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EstimateError::ZeroBatch => write!(f, "batch size must be at least 1"),
            EstimateError::ZeroSeqLen => write!(
                f,
                "sequence length (image side for vision models) must be at least 1"
            ),
            EstimateError::SeqLenTooLong { max } => {
                write!(
                    f,
                    "this model has learned position embeddings for at most {max} tokens"
                )
            }
            EstimateError::ImageSizeMismatch { expected } => {
                write!(f, "this ViT takes {expected} x {expected} images only (learned position embeddings)")
            }
            EstimateError::TooLarge => write!(f, "the memory figure does not fit in 64 bits"),
        }
    }
}

impl std::error::Error for EstimateError {}

/// Estimates the peak memory of one step of `arch` as configured by `step`.
///
/// # Errors
/// [`EstimateError`] for a zero batch or length, a sequence the model cannot take, or a figure
/// beyond 64 bits.
pub fn estimate_peak(
    arch: &Architecture,
    step: &TrainingStep,
) -> Result<PeakEstimate, EstimateError> {
    if step.batch == 0 {
        return Err(EstimateError::ZeroBatch);
    }
    if step.seq_len == 0 {
        return Err(EstimateError::ZeroSeqLen);
    }
    let seq = if arch.is_vision() {
        if step.seq_len != arch.image_size() {
            return Err(EstimateError::ImageSizeMismatch {
                expected: arch.image_size(),
            });
        }
        arch.vit_tokens()
    } else {
        if let Some(max) = arch.max_positions() {
            if step.seq_len > max {
                return Err(EstimateError::SeqLenTooLong { max });
            }
        }
        step.seq_len
    };
    let spec = &arch.spec;
    let p = step.precision;
    let d = Dtypes {
        amp: p.autocast(),
        act: p.activation_bytes(),
        weight: p.residual_bytes(),
    };
    // Gemma 2's soft-capped attention runs eager whatever is asked (transformers refuses SDPA)
    let eager =
        step.attention == AttentionKernel::Eager || spec.layers.iter().any(|l| l.attention.softcap);
    let shape = StepShape {
        batch: step.batch,
        seq,
        eager,
        d,
    };
    let groups = spec.layer_groups();
    // bytes of every parameter tensor stored with `bytes` per element
    let all_params = |bytes: u64| -> Res<u64> {
        groups.iter().try_fold(
            sum_storages(&spec.outside_parameter_tensors(), bytes)?,
            |acc, (layer, count)| add(acc, mul(sum_storages(&layer.params(), bytes)?, *count)?),
        )
    };
    let n_tensors = groups.iter().try_fold(
        spec.outside_parameter_tensors().len() as u64,
        |acc, (layer, count)| add(acc, mul(layer.params().len() as u64, *count)?),
    )?;
    let params = all_params(p.weight_bytes())?;
    let trains = step.optimizer.trains();
    let grads = if trains {
        all_params(p.gradient_bytes())?
    } else {
        0
    };
    let state_one = all_params(p.optimizer_state_bytes())?;
    let master = if trains && p.master_weights() {
        all_params(4)?
    } else {
        0
    };
    let mut opt_state = add(
        mul(state_one, step.optimizer.state_tensors_per_param())?,
        master,
    )?;
    if step.optimizer == Optimizer::AdamW {
        opt_state = add(opt_state, mul(n_tensors, BLOCK)?)?; // step counters
    }
    let opt_temp = if step.optimizer == Optimizer::AdamW {
        state_one
    } else {
        0
    };
    let mut buffers = spec
        .buffers
        .iter()
        .try_fold(0, |acc, &(elems, bytes)| add(acc, storage(elems, bytes)?))?;
    // the input batch: token ids, or the images and their labels
    let input = if let Some(vis) = spec.vision {
        let px = mul(mul(step.batch, 3)?, mul(vis.image, vis.image)?)?;
        let px_bytes = if p == PrecisionRecipe::Bf16 {
            2
        } else {
            p.weight_bytes().min(4)
        };
        add(storage(px, px_bytes)?, storage(step.batch, 8)?)?
    } else {
        storage(mul(step.batch, seq)?, 8)?
    };
    buffers = add(buffers, input)?;
    let acts = spec.forward(&shape)?;
    let cast = |e: &[u64]| -> Res<u64> {
        if p.autocast() {
            sum_storages(e, 2)
        } else {
            Ok(0)
        }
    };
    // autocast's 16-bit weight copies, per layer group
    let group_casts = groups
        .iter()
        .map(|(l, _)| cast(&l.linear_params(!trains)))
        .collect::<Res<Vec<u64>>>()?;
    let all_layer_casts = groups
        .iter()
        .zip(&group_casts)
        .try_fold(0, |acc, ((_, count), c)| add(acc, mul(*c, *count)?))?;
    let head_cast = cast(&spec.head_linears(!trains))?;

    let base = CategoryBytes {
        parameters: params,
        buffers,
        optimizer_states: opt_state,
        ..CategoryBytes::default()
    };
    let tokens = mul(step.batch, seq)?;
    if !trains {
        let fwd = CategoryBytes {
            activations: add(add(all_layer_casts, head_cast)?, acts.inference)?,
            ..base
        };
        let total = fwd.total().ok_or(EstimateError::TooLarge)?;
        let kept = if arch.is_vision() {
            mul(step.batch, arch.vocab_size())?
        } else {
            mul(tokens, arch.vocab_size())?
        };
        let mut parts = PartBytes::default();
        parts.add(SavedPart::WeightCopies, add(all_layer_casts, head_cast)?)?;
        parts.add(SavedPart::WorkingSet, acts.inference)?;
        return Ok(PeakEstimate {
            saved_parts: parts.listed(),
            n_params: arch.parameter_count(),
            peak_bytes: total,
            peak_phase: Phase::Forward,
            at_peak: fwd,
            phase_peaks: vec![(Phase::Forward, fwd)],
            // what stays alive after a no-grad forward: the logits
            saved_activation_bytes: storage(kept, p.activation_bytes())?,
        });
    }
    // one layer's saved tensors with its weight copies, per group
    let full_layers = acts
        .per_group
        .iter()
        .zip(&group_casts)
        .map(|(a, c)| add(*a, *c))
        .collect::<Res<Vec<u64>>>()?;
    let largest_layer = full_layers.iter().copied().max().unwrap_or(0);
    let all_layers = groups
        .iter()
        .zip(&full_layers)
        .try_fold(0, |acc, ((_, count), f)| add(acc, mul(*f, *count)?))?;
    // inside the last layer's backward: the head's gradients exist, its saved tensors are gone
    let head_grads = sum_storages(&spec.head_gradient_tensors(), p.gradient_bytes())?;
    let inner = spec.layers.last().map_or(0, |l| l.mlp.inner_per_token());
    let layer_transient = add(
        storage(tokens, mul(inner, d.act)?)?,
        storage(tokens, mul(spec.hidden(), d.resid())?)?,
    )?;
    let layer_backward = add(layer_transient, head_grads)?.saturating_sub(acts.head_saved);
    let layer_input = storage(tokens, mul(spec.hidden(), d.resid())?)?;
    let (saved, bwd_inner) = match step.checkpointing {
        Checkpointing::None => (
            add(add(all_layers, acts.outside)?, head_cast)?,
            layer_backward,
        ),
        Checkpointing::Full => (
            add(
                add(mul(layer_input, arch.num_layers())?, acts.outside)?,
                head_cast,
            )?,
            add(largest_layer, layer_backward)?,
        ),
    };
    // under checkpointing + autocast the forward's weight-cast cache holds every layer's
    // 16-bit copies until autocast exits (only the head's are saved for backward)
    let cached = if step.checkpointing == Checkpointing::Full {
        all_layer_casts
    } else {
        0
    };
    let fwd = CategoryBytes {
        activations: saved,
        temporaries: add(acts.loss_forward, cached)?,
        ..base
    };
    let bwd_start = CategoryBytes {
        activations: saved,
        temporaries: acts.loss_buffers.max(bwd_inner),
        ..base
    };
    // The end of backward: the embedding's backward makes its weight's gradient while the
    // gradient of its output is still alive; a tied weight already holds the head's share,
    // and the two are summed into a third tensor (measured: 3 embedding-sized buffers).
    let bwd_end = if arch.is_vision() {
        CategoryBytes {
            gradients: grads,
            ..base
        }
    } else {
        let embedding = storage(mul(arch.vocab_size(), spec.hidden())?, p.gradient_bytes())?;
        let incoming = storage(tokens, mul(spec.hidden(), d.resid())?)?;
        CategoryBytes {
            gradients: grads.saturating_sub(embedding),
            temporaries: if spec.tied {
                mul(embedding, 3)?
            } else {
                add(embedding, incoming)?
            },
            ..base
        }
    };
    // Inside the last layer's eager attention backward: the head's and the MLP's saved tensors
    // and the probabilities are gone, their gradients exist, and the softmax backward holds two
    // fp32 score-sized buffers.
    let bwd_attention = match spec.layers.last() {
        Some(last) if matches!(last.attention.kernel(&shape), Kernel::Eager | Kernel::Math) => {
            let hs2 = mul(mul(step.batch, last.attention.heads)?, mul(seq, seq)?)?;
            let mut last_grads = spec.head_gradient_tensors();
            last.mlp.params(&mut last_grads);
            let recomputed = if step.checkpointing == Checkpointing::Full {
                largest_layer
            } else {
                0
            };
            let freed = add(
                add(acts.head_saved, acts.last_layer_parts.get(SavedPart::Mlp))?,
                storage(hs2, d.act)?,
            )?;
            Some(CategoryBytes {
                activations: add(saved, recomputed)?.saturating_sub(freed),
                gradients: sum_storages(&last_grads, p.gradient_bytes())?,
                temporaries: add(mul(storage(hs2, 4)?, 2)?, layer_input)?,
                ..base
            })
        }
        _ => None,
    };
    let mut bwd = if bwd_start.total() >= bwd_end.total() {
        bwd_start
    } else {
        bwd_end
    };
    if let Some(inside) = bwd_attention {
        if inside.total() > bwd.total() {
            bwd = inside;
        }
    }
    let opt = CategoryBytes {
        gradients: grads,
        temporaries: opt_temp,
        ..base
    };
    let phases = vec![
        (Phase::Forward, fwd),
        (Phase::Backward, bwd),
        (Phase::OptimizerStep, opt),
    ];
    let mut best = (Phase::Forward, fwd, 0u64);
    for (ph, c) in &phases {
        let t = c.total().ok_or(EstimateError::TooLarge)?;
        if t > best.2 || (t == best.2 && *ph == Phase::OptimizerStep) {
            best = (*ph, *c, t);
        }
    }
    let mut parts = acts.outside_parts;
    match step.checkpointing {
        Checkpointing::None => {
            parts.merge(&acts.layer_parts)?;
            parts.add(SavedPart::WeightCopies, add(all_layer_casts, head_cast)?)?;
        }
        Checkpointing::Full => {
            parts.add(SavedPart::LayerInputs, mul(layer_input, arch.num_layers())?)?;
            parts.add(SavedPart::WeightCopies, head_cast)?;
        }
    }
    Ok(PeakEstimate {
        saved_parts: parts.listed(),
        n_params: arch.parameter_count(),
        peak_bytes: best.2,
        peak_phase: best.0,
        at_peak: best.1,
        phase_peaks: phases,
        saved_activation_bytes: saved,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::Preset;

    fn step(
        batch: u64,
        seq_len: u64,
        precision: PrecisionRecipe,
        optimizer: Optimizer,
    ) -> TrainingStep {
        TrainingStep {
            batch,
            seq_len,
            precision,
            optimizer,
            attention: AttentionKernel::Sdpa,
            checkpointing: Checkpointing::None,
        }
    }

    #[allow(non_snake_case)]
    fn P(key: &str) -> Preset {
        Preset::from_key(key).expect("preset")
    }

    #[track_caller]
    fn arch_of(preset: Preset) -> Architecture {
        preset.architecture().expect("preset parses")
    }

    #[track_caller]
    fn fails(preset: Preset, s: TrainingStep, expected: EstimateError) {
        assert_eq!(
            estimate_peak(&arch_of(preset), &s),
            Err(expected),
            "{preset:?} {s:?}"
        );
    }

    #[test]
    fn rejects_impossible_steps() {
        use PrecisionRecipe::Fp32;
        fails(
            P("gpt2"),
            step(0, 128, Fp32, Optimizer::AdamW),
            EstimateError::ZeroBatch,
        );
        fails(
            P("gpt2"),
            step(1, 0, Fp32, Optimizer::AdamW),
            EstimateError::ZeroSeqLen,
        );
        fails(
            P("gpt2"),
            step(1, 1025, Fp32, Optimizer::AdamW),
            EstimateError::SeqLenTooLong { max: 1024 },
        );
        fails(
            P("bert-base"),
            step(1, 513, Fp32, Optimizer::AdamW),
            EstimateError::SeqLenTooLong { max: 512 },
        );
        fails(
            P("vit-b16"),
            step(1, 256, Fp32, Optimizer::AdamW),
            EstimateError::ImageSizeMismatch { expected: 224 },
        );
        fails(
            P("llama3-8b"),
            step(u64::MAX, 2048, Fp32, Optimizer::AdamW),
            EstimateError::TooLarge,
        );
        assert!(EstimateError::SeqLenTooLong { max: 1024 }
            .to_string()
            .contains("1024"));
    }

    #[track_caller]
    fn peak(preset: Preset, s: TrainingStep) -> PeakEstimate {
        match estimate_peak(&arch_of(preset), &s) {
            Ok(e) => e,
            Err(e) => panic!("{preset:?}: {e}"),
        }
    }

    #[test]
    fn categories_sum_to_the_peak_and_grow_with_batch() {
        for preset in Preset::ALL {
            let seq = preset.default_seq_len();
            for precision in PrecisionRecipe::ALL {
                let small = peak(preset, step(1, seq, precision, Optimizer::AdamW));
                let large = peak(preset, step(8, seq, precision, Optimizer::AdamW));
                assert_eq!(small.at_peak.total(), Some(small.peak_bytes));
                assert!(
                    large.peak_bytes >= small.peak_bytes,
                    "{preset:?} {precision:?}"
                );
                assert!(large.saved_activation_bytes > small.saved_activation_bytes);
                assert_eq!(small.phase_peaks.len(), 3);
            }
        }
    }

    #[test]
    fn saved_parts_sum_to_the_saved_activations() {
        for preset in Preset::ALL {
            let seq = preset.default_seq_len();
            for gc in [Checkpointing::None, Checkpointing::Full] {
                for attention in AttentionKernel::ALL {
                    let s = TrainingStep {
                        checkpointing: gc,
                        attention,
                        ..step(2, seq, PrecisionRecipe::AmpBf16, Optimizer::AdamW)
                    };
                    let e = peak(preset, s);
                    let sum: u64 = e.saved_parts.iter().map(|(_, b)| b).sum();
                    assert_eq!(sum, e.saved_activation_bytes, "{} {gc:?}", preset.key());
                }
            }
            let e = peak(preset, step(2, seq, PrecisionRecipe::Bf16, Optimizer::None));
            let sum: u64 = e.saved_parts.iter().map(|(_, b)| b).sum();
            assert_eq!(sum, e.at_peak.activations, "{} inference", preset.key());
        }
    }

    #[test]
    fn new_op_kinds_show_in_the_breakdown() {
        let parts = |key: &str, attention| {
            let s = TrainingStep {
                attention,
                ..step(1, 1024, PrecisionRecipe::Bf16, Optimizer::AdamW)
            };
            peak(P(key), s)
                .saved_parts
                .iter()
                .map(|(p, _)| *p)
                .collect::<Vec<_>>()
        };
        let qwen3 = parts("qwen3-0.6b", AttentionKernel::Sdpa);
        assert!(qwen3.contains(&SavedPart::QkNorms) && !qwen3.contains(&SavedPart::PostNorms));
        let gemma2 = parts("gemma2-2b", AttentionKernel::Sdpa);
        assert!(gemma2.contains(&SavedPart::PostNorms) && gemma2.contains(&SavedPart::SoftCapping));
        assert!(
            gemma2.contains(&SavedPart::AttentionScores),
            "Gemma 2 runs eager"
        );
        let olmo = parts("olmo2-1b", AttentionKernel::Sdpa);
        assert!(olmo.contains(&SavedPart::QkNorms) && olmo.contains(&SavedPart::PostNorms));
        let llama = parts("llama3.2-1b", AttentionKernel::Sdpa);
        assert!(!llama.contains(&SavedPart::QkNorms) && !llama.contains(&SavedPart::Masks));
        let phi = parts("phi3-mini", AttentionKernel::Sdpa);
        assert!(!phi.contains(&SavedPart::Masks));
    }

    #[test]
    fn mixed_precision_keeps_sixteen_bytes_per_parameter_in_the_step() {
        let e = peak(
            P("llama3-8b"),
            step(1, 128, PrecisionRecipe::MixedBf16, Optimizer::AdamW),
        );
        let opt = e
            .phase_peaks
            .iter()
            .find(|(p, _)| *p == Phase::OptimizerStep)
            .map(|(_, c)| *c);
        let opt = opt.unwrap_or_default();
        let per_param =
            (opt.parameters + opt.gradients + opt.optimizer_states) as f64 / e.n_params as f64;
        assert!((per_param - 16.0).abs() < 0.01, "{per_param}");
        assert_eq!(e.peak_phase, Phase::OptimizerStep);
    }

    #[test]
    fn checkpointing_and_sdpa_save_less() {
        let base = step(4, 1024, PrecisionRecipe::AmpBf16, Optimizer::AdamW);
        let plain = peak(P("gpt2-medium"), base);
        let gc = peak(
            P("gpt2-medium"),
            TrainingStep {
                checkpointing: Checkpointing::Full,
                ..base
            },
        );
        let eager = peak(
            P("gpt2-medium"),
            TrainingStep {
                attention: AttentionKernel::Eager,
                ..base
            },
        );
        assert!(gc.saved_activation_bytes < plain.saved_activation_bytes / 3);
        assert!(eager.saved_activation_bytes > plain.saved_activation_bytes);
    }

    #[test]
    fn inference_has_no_gradients_or_state() {
        let e = peak(
            P("qwen2.5-0.5b"),
            step(2, 2048, PrecisionRecipe::Bf16, Optimizer::None),
        );
        assert_eq!((e.at_peak.gradients, e.at_peak.optimizer_states), (0, 0));
        assert_eq!(e.peak_phase, Phase::Forward);
        assert_eq!(e.phase_peaks.len(), 1);
    }

    #[test]
    fn sliding_window_masks_only_long_sequences() {
        let short = peak(
            P("mistral-7b"),
            step(1, 4095, PrecisionRecipe::Bf16, Optimizer::AdamW),
        );
        let long = peak(
            P("mistral-7b"),
            step(1, 4096, PrecisionRecipe::Bf16, Optimizer::AdamW),
        );
        let per_token = |e: &PeakEstimate, t: u64| e.saved_activation_bytes / t;
        assert!(per_token(&long, 4096) > per_token(&short, 4095) + 10_000);
    }
}
