//! Peak memory of one training step, tensor by tensor (see the module docs in `mod.rs`).

use super::config::{Architecture, ModelFamily};
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

type Res<T> = Result<T, EstimateError>;

/// The attention implementation that runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kernel {
    Eager,
    Flash,
    Efficient,
    Math,
}

const BLOCK: u64 = 512;

fn mul(a: u64, b: u64) -> Res<u64> {
    a.checked_mul(b).ok_or(EstimateError::TooLarge)
}
fn add(a: u64, b: u64) -> Res<u64> {
    a.checked_add(b).ok_or(EstimateError::TooLarge)
}
/// Bytes of one storage of `elems` elements of `bytes` each, rounded to the allocator block.
fn storage(elems: u64, bytes: u64) -> Res<u64> {
    let raw = mul(elems, bytes)?;
    raw.div_ceil(BLOCK)
        .checked_mul(BLOCK)
        .ok_or(EstimateError::TooLarge)
}
fn sum_storages(elems: &[u64], bytes: u64) -> Res<u64> {
    elems
        .iter()
        .try_fold(0, |acc, &e| add(acc, storage(e, bytes)?))
}

/// Collects tensors of `tokens x width` elements.
struct Tape {
    tokens: u64,
    total: u64,
    head_start: u64,
}
impl Tape {
    fn new(tokens: u64) -> Self {
        Tape {
            tokens,
            total: 0,
            head_start: 0,
        }
    }
    /// Marks where the head's tensors (freed early in backward) begin.
    fn head(&mut self) {
        self.head_start = self.total;
    }
    /// A tensor of `width` elements per token, `bytes` each.
    fn t(&mut self, width: u64, bytes: u64) -> Res<()> {
        self.total = add(self.total, storage(mul(self.tokens, width)?, bytes)?)?;
        Ok(())
    }
    /// A tensor of `elems` elements in all.
    fn raw(&mut self, elems: u64, bytes: u64) -> Res<()> {
        self.total = add(self.total, storage(elems, bytes)?)?;
        Ok(())
    }
}

/// The activation side of the model: what the forward saves and the backward's buffers.
struct Activations {
    /// Saved by one layer (without checkpointing).
    per_layer: u64,
    /// Saved outside the layers (embeddings, final norm, head, loss, rotary tables).
    outside: u64,
    /// The residual stream entering one layer (what checkpointing keeps).
    layer_input: u64,
    /// Gradient buffers of the loss at the start of backward.
    loss_buffers: u64,
    /// Extra forward transient at the loss (logits and their fp32 copy).
    loss_forward: u64,
    /// Largest transient inside one layer's backward (gradients of the MLP intermediate and
    /// of the residual stream), before subtracting what the head has freed by then.
    layer_backward: u64,
    /// Saved tensors of the final norm, head and loss (freed before the last layer's backward).
    head_saved: u64,
    /// Largest set of live tensors in a no-grad forward, beyond weights and input.
    inference: u64,
}

fn activations(a: &Architecture, s: &TrainingStep, seq: u64) -> Res<Activations> {
    let p = s.precision;
    let amp = p.autocast();
    let w = p.activation_bytes();
    let r = p.residual_bytes();
    let (h, i, v) = (a.hidden, a.intermediate, a.vocab);
    let (q, kv) = (mul(a.heads, a.head_dim)?, mul(a.kv_heads, a.head_dim)?);
    let tokens = mul(s.batch, seq)?;
    let tv = mul(tokens, v)?;
    let mut l = Tape::new(tokens);
    let mut o = Tape::new(tokens);
    // a matmul input: under autocast each linear keeps its own 16-bit cast copy
    let eager = s.attention == AttentionKernel::Eager;
    let hs2 = mul(mul(s.batch, a.heads)?, mul(seq, seq)?)?;
    // The attention kernel, as PyTorch's CUDA dispatch picks it on sm80+: flash for 16-bit
    // inputs without a mask (GQA allowed), memory-efficient otherwise unless GQA is requested
    // (it cannot), then the math fallback. HF passes no mask (is_causal) unless a sliding
    // window is shorter than the sequence, and repeats k/v itself when it passes one.
    let gqa = a.heads != a.kv_heads;
    let masked = a.family.is_llama_like() && a.sliding_window > 0 && seq >= a.sliding_window;
    let kernel = if eager {
        Kernel::Eager
    } else if w == 2 && a.head_dim.is_multiple_of(8) && a.head_dim <= 256 && !masked {
        Kernel::Flash
    } else if masked || !gqa {
        Kernel::Efficient
    } else {
        Kernel::Math
    };
    let attention_core = |l: &mut Tape| -> Res<()> {
        if kernel == Kernel::Math {
            l.raw(hs2, w)?; // softmax output
            if a.attn_dropout {
                l.raw(hs2, 1)?;
                l.raw(hs2, w)?;
            }
        } else if kernel == Kernel::Flash {
            l.raw(mul(s.batch, mul(a.heads, seq)?)?, 4)?; // logsumexp
        } else if kernel == Kernel::Efficient {
            // the memory-efficient kernel pads its logsumexp to a multiple of 32
            let padded = seq
                .div_ceil(32)
                .checked_mul(32)
                .ok_or(EstimateError::TooLarge)?;
            l.raw(mul(s.batch, mul(a.heads, padded)?)?, 4)?;
        } else {
            let sm = if amp || a.family.is_llama_like() {
                4
            } else {
                w
            };
            l.raw(hs2, sm)?;
            if a.attn_dropout {
                l.raw(hs2, 1)?;
                l.raw(hs2, w)?;
            } else if sm != w {
                l.raw(hs2, w)?;
            }
        }
        Ok(())
    };
    let stats = |l: &mut Tape| -> Res<()> {
        l.t(1, 4)?;
        l.t(1, 4)
    };
    let mask = |l: &mut Tape, on: bool| -> Res<()> {
        if on {
            l.t(h, 1)
        } else {
            Ok(())
        }
    };
    let logits_16 = storage(tv, w)?;
    let logits_32 = storage(tv, 4)?;
    let res = match a.family {
        ModelFamily::Gpt2 => {
            // ln_1 input, stats, c_attn input, fused qkv (views kept by sdpa), attention output
            l.t(h, r)?;
            stats(&mut l)?;
            l.t(h, w)?;
            l.t(3 * h, w)?;
            l.t(h, w)?;
            attention_core(&mut l)?;
            mask(&mut l, a.hidden_dropout)?;
            l.t(h, r)?;
            stats(&mut l)?;
            l.t(h, w)?;
            if a.python_gelu {
                // 0.5*x*(1+tanh(...)): pow's input, tanh output, 0.5*x, 1+tanh (fp32 under autocast: pow)
                l.t(i, if amp { 4 } else { w })?;
                l.t(i, if amp { 4 } else { w })?;
                l.t(i, w)?;
                l.t(i, if amp { 4 } else { w })?;
            } else {
                l.t(i, w)?;
            }
            l.t(i, w)?; // c_proj input
            mask(&mut l, a.hidden_dropout)?;
            mask(&mut o, a.hidden_dropout)?;
            o.head();
            o.t(h, r)?;
            stats(&mut o)?;
            o.t(h, w)?;
            o.raw(tv, 4)?; // log_softmax of the fp32 logits
            o.t(1, 8)?; // shifted labels
            let inference = add(
                add(storage(tv, w)?, storage(mul(tokens, h)?, r)?)?,
                if amp { storage(mul(tokens, h)?, 2)? } else { 0 },
            )?;
            (
                add(logits_32, logits_32)?,
                add(logits_16, if w == 4 { 0 } else { logits_32 })?,
                inference,
            )
        }
        ModelFamily::Bert => {
            if amp {
                for _ in 0..3 {
                    l.t(h, 2)?;
                }
            } else {
                l.t(h, w)?;
            }
            l.t(h, w)?;
            l.t(h, w)?;
            l.t(h, w)?;
            l.t(h, w)?; // q, k, v, attention output
            attention_core(&mut l)?;
            mask(&mut l, a.hidden_dropout)?;
            l.t(h, r)?;
            stats(&mut l)?;
            l.t(h, w)?; // intermediate input (cast under autocast)
            l.t(i, w)?;
            l.t(i, w)?;
            mask(&mut l, a.hidden_dropout)?;
            l.t(h, r)?;
            stats(&mut l)?;
            // embeddings: layer norm input, stats, dropout mask
            o.t(h, r)?;
            stats(&mut o)?;
            mask(&mut o, a.hidden_dropout)?;
            o.head();
            // MLM head: transform dense input, gelu input, layer norm input, decoder input
            o.t(h, w)?;
            o.t(h, w)?;
            o.t(h, r)?;
            stats(&mut o)?;
            o.t(h, w)?;
            let loss_dtype = if amp { 4 } else { w };
            o.raw(tv, loss_dtype)?;
            if amp {
                o.raw(tv, 2)?; // the 16-bit logits stay referenced by the cross-entropy graph
            }
            let buffers = if amp {
                logits_32
            } else {
                mul(storage(tv, w)?, 2)?
            };
            let hidden = storage(mul(tokens, h)?, r)?;
            let inference = add(
                add(storage(tv, w)?, mul(hidden, 2)?)?,
                if amp { storage(mul(tokens, h)?, 2)? } else { 0 },
            )?;
            (buffers, storage(tv, w)?, inference)
        }
        ModelFamily::Vit => {
            l.t(h, r)?;
            stats(&mut l)?;
            l.t(h, w)?;
            l.t(3 * h, w)?;
            l.t(h, w)?;
            attention_core(&mut l)?;
            l.t(h, r)?;
            stats(&mut l)?;
            l.t(h, w)?;
            l.t(i, w)?;
            l.t(i, w)?;
            let b = s.batch;
            if amp {
                // the conv stem keeps its 16-bit cast of the image until the very end of backward
                o.raw(mul(b, mul(3, mul(seq_pixels(a), seq_pixels(a))?)?)?, 2)?;
            }
            o.head();
            o.t(h, r)?;
            stats(&mut o)?;
            if amp {
                o.raw(mul(b, h)?, 2)?;
                o.raw(mul(b, v)?, 2)?;
            } else {
                o.t(h, w)?;
            }
            o.raw(mul(b, v)?, if w == 2 && !amp { 2 } else { 4 })?;
            let hidden = storage(mul(tokens, h)?, r)?;
            let inner = storage(mul(tokens, i)?, w)?;
            let inference = add(mul(hidden, 5)?, mul(inner, 2)?)?;
            (storage(mul(b, v)?, 4)?, 0, inference)
        }
        _ => {
            // Llama-style: RMSNorm keeps its fp32 input, rsqrt and normalised output; rotary
            // q/k products are fresh tensors; sdpa keeps q, k, v, output, logsumexp.
            let phi = a.family == ModelFamily::Phi3;
            let norm = |l: &mut Tape, consumers: u64| -> Res<()> {
                l.t(h, 4)?;
                l.t(1, 4)?;
                if amp {
                    l.t(h, 4)?;
                    for _ in 0..consumers {
                        l.t(h, 2)?;
                    }
                } else {
                    l.t(h, if a.family == ModelFamily::Gemma { 4 } else { w })?;
                    l.t(h, w)?;
                }
                Ok(())
            };
            // k/v repeated for every query head: always inside the math kernel; by HF's
            // repeat_kv (eager, or sdpa with a mask) unless that stays a view (one kv head and
            // one sample: the expand folds into a stride-0 view)
            let view_ok = a.kv_heads == 1 && s.batch == 1;
            let repeat = gqa && (kernel == Kernel::Math || ((eager || masked) && !view_ok));
            norm(&mut l, if phi { 1 } else { 3 })?;
            l.t(q, w)?; // rotated q (cast to 16 bits under autocast)
            l.t(kv, w)?; // rotated k
            if phi {
                l.t(add(q, 2 * kv)?, w)?; // v is a view of the fused qkv output
            } else {
                l.t(kv, w)?;
            }
            if repeat {
                // repeat_kv materialises k and v for every query head; the sdpa copies go away
                l.t(q, w)?;
                l.t(q, w)?;
                l.total = l.total.saturating_sub(storage(mul(tokens, kv)?, w)?);
                l.total = l.total.saturating_sub(storage(
                    mul(tokens, if phi { add(q, 2 * kv)? } else { kv })?,
                    w,
                )?);
            }
            l.t(q, w)?; // attention output
            attention_core(&mut l)?;
            mask(&mut l, a.hidden_dropout)?;
            norm(&mut l, if phi { 1 } else { 2 })?;
            if phi {
                l.t(2 * i, w)?;
            } else {
                l.t(i, w)?;
                l.t(i, w)?;
            }
            l.t(i, w)?;
            l.t(i, w)?;
            mask(&mut l, a.hidden_dropout)?;
            if masked {
                o.raw(mul(s.batch, mul(seq, seq)?)?, 1)?;
            }
            o.t(a.head_dim, r)?; // cos
            o.t(a.head_dim, r)?; // sin
            o.head();
            norm(&mut o, 1)?;
            o.raw(tv, 4)?;
            o.t(1, 8)?;
            let head_inference = add(storage(tv, w)?, storage(mul(tokens, h)?, w)?)?;
            // inside the MLP: residual, norm output and the intermediates alive together
            let inner = storage(mul(tokens, i)?, w)?;
            let mlp_inference = add(
                mul(storage(mul(tokens, h)?, r)?, 2)?,
                mul(inner, if phi { 4 } else { 3 })?,
            )?;
            let inference = head_inference.max(mlp_inference);
            (
                add(logits_32, logits_32)?,
                add(logits_16, if w == 4 { 0 } else { logits_32 })?,
                inference,
            )
        }
    };
    let (loss_buffers, loss_forward, inference) = res;
    let layer_backward = add(storage(mul(tokens, i)?, w)?, storage(mul(tokens, h)?, r)?)?;
    let head_saved = o.total.saturating_sub(o.head_start);
    Ok(Activations {
        per_layer: l.total,
        outside: o.total,
        layer_input: storage(mul(tokens, h)?, r)?,
        loss_buffers,
        loss_forward,
        layer_backward,
        head_saved,
        inference,
    })
}

fn seq_pixels(a: &Architecture) -> u64 {
    a.image_size
}

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
        if step.seq_len != arch.image_size {
            return Err(EstimateError::ImageSizeMismatch {
                expected: arch.image_size,
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
    let p = step.precision;
    let tensors = arch.parameter_tensors();
    let n_tensors = tensors.len() as u64;
    let params = sum_storages(&tensors, p.weight_bytes())?;
    let trains = step.optimizer.trains();
    let grads = if trains {
        sum_storages(&tensors, p.gradient_bytes())?
    } else {
        0
    };
    let state_one = sum_storages(&tensors, p.optimizer_state_bytes())?;
    let master = if trains && p.master_weights() {
        sum_storages(&tensors, 4)?
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
    // buffers (rotary inv_freq pair, BERT position/token-type ids) and the input batch
    let buffers = match arch.family() {
        ModelFamily::Bert => add(
            storage(arch.max_positions, 8)?,
            storage(arch.max_positions, 8)?,
        )?,
        ModelFamily::Gpt2 | ModelFamily::Vit => 0,
        _ => 2 * BLOCK,
    };
    let input = if arch.is_vision() {
        let px = mul(mul(step.batch, 3)?, mul(arch.image_size, arch.image_size)?)?;
        add(
            storage(
                px,
                if p == PrecisionRecipe::Bf16 {
                    2
                } else {
                    p.weight_bytes().min(4)
                },
            )?,
            storage(step.batch, 8)?,
        )?
    } else {
        storage(mul(step.batch, seq)?, 8)?
    };
    let buffers = add(buffers, input)?;
    let acts = activations(arch, step, seq)?;
    let cast = |e: &[u64]| -> Res<u64> {
        if p.autocast() {
            sum_storages(e, 2)
        } else {
            Ok(0)
        }
    };
    let layer_cast = cast(&arch.layer_linears())?;
    let head_cast = cast(&arch.head_linears())?;
    let layers = arch.num_layers();

    let base = CategoryBytes {
        parameters: params,
        buffers,
        optimizer_states: opt_state,
        ..CategoryBytes::default()
    };
    if !trains {
        let all_casts = add(mul(layer_cast, layers)?, head_cast)?;
        let fwd = CategoryBytes {
            activations: add(all_casts, acts.inference)?,
            ..base
        };
        let total = fwd.total().ok_or(EstimateError::TooLarge)?;
        return Ok(PeakEstimate {
            n_params: arch.parameter_count(),
            peak_bytes: total,
            peak_phase: Phase::Forward,
            at_peak: fwd,
            phase_peaks: vec![(Phase::Forward, fwd)],
            // what stays alive after a no-grad forward: the logits
            saved_activation_bytes: if arch.is_vision() {
                storage(mul(step.batch, arch.vocab)?, p.activation_bytes())?
            } else {
                storage(
                    mul(mul(step.batch, seq)?, arch.vocab)?,
                    p.activation_bytes(),
                )?
            },
        });
    }
    let full_layer = add(acts.per_layer, layer_cast)?;
    // inside the last layer's backward: the head's gradients exist, its saved tensors are gone
    let head_grads = sum_storages(&arch.head_tensors(), p.gradient_bytes())?;
    let layer_backward = add(acts.layer_backward, head_grads)?.saturating_sub(acts.head_saved);
    let (saved, bwd_inner) = match step.checkpointing {
        Checkpointing::None => (
            add(add(mul(full_layer, layers)?, acts.outside)?, head_cast)?,
            layer_backward,
        ),
        Checkpointing::Full => (
            add(
                add(mul(acts.layer_input, layers)?, acts.outside)?,
                head_cast,
            )?,
            add(full_layer, layer_backward)?,
        ),
    };
    // under checkpointing + autocast the forward's weight-cast cache holds every layer's
    // 16-bit copies until autocast exits (only the head's are saved for backward)
    let cached = if step.checkpointing == Checkpointing::Full {
        mul(layer_cast, layers)?
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
    let bwd_end = CategoryBytes {
        gradients: grads,
        ..base
    };
    let bwd = if bwd_start.total() >= bwd_end.total() {
        bwd_start
    } else {
        bwd_end
    };
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
    Ok(PeakEstimate {
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

    #[track_caller]
    fn fails(preset: Preset, s: TrainingStep, expected: EstimateError) {
        assert_eq!(
            estimate_peak(&preset.architecture(), &s),
            Err(expected),
            "{preset:?} {s:?}"
        );
    }

    #[test]
    fn rejects_impossible_steps() {
        use PrecisionRecipe::Fp32;
        fails(
            Preset::Gpt2Small,
            step(0, 128, Fp32, Optimizer::AdamW),
            EstimateError::ZeroBatch,
        );
        fails(
            Preset::Gpt2Small,
            step(1, 0, Fp32, Optimizer::AdamW),
            EstimateError::ZeroSeqLen,
        );
        fails(
            Preset::Gpt2Small,
            step(1, 1025, Fp32, Optimizer::AdamW),
            EstimateError::SeqLenTooLong { max: 1024 },
        );
        fails(
            Preset::BertBase,
            step(1, 513, Fp32, Optimizer::AdamW),
            EstimateError::SeqLenTooLong { max: 512 },
        );
        fails(
            Preset::VitB16,
            step(1, 256, Fp32, Optimizer::AdamW),
            EstimateError::ImageSizeMismatch { expected: 224 },
        );
        fails(
            Preset::Llama3_8B,
            step(u64::MAX, 2048, Fp32, Optimizer::AdamW),
            EstimateError::TooLarge,
        );
        assert!(EstimateError::SeqLenTooLong { max: 1024 }
            .to_string()
            .contains("1024"));
    }

    #[track_caller]
    fn peak(preset: Preset, s: TrainingStep) -> PeakEstimate {
        match estimate_peak(&preset.architecture(), &s) {
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
    fn mixed_precision_keeps_sixteen_bytes_per_parameter_in_the_step() {
        let e = peak(
            Preset::Llama3_8B,
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
        let plain = peak(Preset::Gpt2Medium, base);
        let gc = peak(
            Preset::Gpt2Medium,
            TrainingStep {
                checkpointing: Checkpointing::Full,
                ..base
            },
        );
        let eager = peak(
            Preset::Gpt2Medium,
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
            Preset::Qwen25_0_5B,
            step(2, 2048, PrecisionRecipe::Bf16, Optimizer::None),
        );
        assert_eq!((e.at_peak.gradients, e.at_peak.optimizer_states), (0, 0));
        assert_eq!(e.peak_phase, Phase::Forward);
        assert_eq!(e.phase_peaks.len(), 1);
    }

    #[test]
    fn sliding_window_masks_only_long_sequences() {
        let short = peak(
            Preset::Mistral7B,
            step(1, 4095, PrecisionRecipe::Bf16, Optimizer::AdamW),
        );
        let long = peak(
            Preset::Mistral7B,
            step(1, 4096, PrecisionRecipe::Bf16, Optimizer::AdamW),
        );
        let per_token = |e: &PeakEstimate, t: u64| e.saved_activation_bytes / t;
        assert!(per_token(&long, 4096) > per_token(&short, 4095) + 10_000);
    }
}
