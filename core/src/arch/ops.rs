//! The op kinds a model is built from, each owning its rules: the parameters it holds, what
//! autograd saves for backward in each precision recipe, and the tensors it creates.
//!
//! A forward pass is emulated on a [`Tape`]: every op takes tensor handles, creates new
//! tensors and marks the ones its backward keeps. A tensor saved by several ops (a norm's
//! output read by three projections) counts once, as PyTorch keeps one storage; a view
//! (a slice of a fused projection) is the same tensor as its base.

use super::estimate::EstimateError;

pub(crate) type Res<T> = Result<T, EstimateError>;

/// The CUDA caching allocator's block: every storage is rounded up to it.
pub(crate) const BLOCK: u64 = 512;

pub(crate) fn mul(a: u64, b: u64) -> Res<u64> {
    a.checked_mul(b).ok_or(EstimateError::TooLarge)
}
pub(crate) fn add(a: u64, b: u64) -> Res<u64> {
    a.checked_add(b).ok_or(EstimateError::TooLarge)
}
/// Bytes of one storage of `elems` elements of `bytes` each, rounded to the allocator block.
pub(crate) fn storage(elems: u64, bytes: u64) -> Res<u64> {
    mul(elems, bytes)?
        .div_ceil(BLOCK)
        .checked_mul(BLOCK)
        .ok_or(EstimateError::TooLarge)
}
pub(crate) fn sum_storages(elems: &[u64], bytes: u64) -> Res<u64> {
    elems
        .iter()
        .try_fold(0, |acc, &e| add(acc, storage(e, bytes)?))
}

/// The dtypes of one step, in bytes per element.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Dtypes {
    /// Forward under autocast (fp32 weights, 16-bit matmuls).
    pub amp: bool,
    /// What matmuls produce.
    pub act: u64,
    /// The stored weights (and so the embeddings' output and the residual stream).
    pub weight: u64,
}

impl Dtypes {
    /// The residual stream: the weights' dtype (fp32 under autocast, norms run in fp32).
    pub fn resid(self) -> u64 {
        self.weight
    }
}

/// A tensor on the tape: its id and element count and element size.
#[derive(Clone, Copy, Debug)]
pub(crate) struct T {
    id: usize,
    pub elems: u64,
    pub bytes: u64,
}

/// What a saved tensor is for, so that a person sees where activations go.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SavedPart {
    /// Token embeddings, positions, rotary tables, the input ids.
    Embeddings,
    /// Norms before the sub-blocks (and BERT's after the residual).
    Norms,
    /// Norms after the sub-blocks (Gemma 2/3, OLMo 2).
    PostNorms,
    /// Query/key norms (Qwen3, Gemma 3, OLMo 2).
    QkNorms,
    /// Projection inputs, q, k, v, the attention output and the kernel's statistics.
    Attention,
    /// Eager attention's seq x seq probabilities.
    AttentionScores,
    /// Sliding-window masks the kernel keeps.
    Masks,
    /// Soft-capping's tanh outputs (Gemma 2).
    SoftCapping,
    /// MLP inputs and intermediates.
    Mlp,
    /// 1-byte dropout masks.
    Dropout,
    /// The final norm, the logits and the loss.
    HeadAndLoss,
    /// Autocast's 16-bit copies of the weights.
    WeightCopies,
    /// The layer inputs that checkpointing keeps.
    LayerInputs,
    /// The largest set of tensors alive at once in a no-grad forward.
    WorkingSet,
}

impl SavedPart {
    /// Every part, in the order the breakdown lists them.
    pub const ALL: [SavedPart; 14] = [
        SavedPart::Embeddings,
        SavedPart::Norms,
        SavedPart::PostNorms,
        SavedPart::QkNorms,
        SavedPart::Attention,
        SavedPart::AttentionScores,
        SavedPart::Masks,
        SavedPart::SoftCapping,
        SavedPart::Mlp,
        SavedPart::Dropout,
        SavedPart::HeadAndLoss,
        SavedPart::WeightCopies,
        SavedPart::LayerInputs,
        SavedPart::WorkingSet,
    ];

    /// Short stable key.
    #[must_use]
    pub const fn key(self) -> &'static str {
        match self {
            SavedPart::Embeddings => "embeddings",
            SavedPart::Norms => "norms",
            SavedPart::PostNorms => "post-norms",
            SavedPart::QkNorms => "qk-norms",
            SavedPart::Attention => "attention",
            SavedPart::AttentionScores => "attention-scores",
            SavedPart::Masks => "masks",
            SavedPart::SoftCapping => "soft-capping",
            SavedPart::Mlp => "mlp",
            SavedPart::Dropout => "dropout",
            SavedPart::HeadAndLoss => "head-loss",
            SavedPart::WeightCopies => "weight-copies",
            SavedPart::LayerInputs => "layer-inputs",
            SavedPart::WorkingSet => "working-set",
        }
    }

    /// Name shown to a person.
    #[must_use]
    pub const fn label(self) -> &'static str {
        match self {
            SavedPart::Embeddings => "Embeddings and rotary tables",
            SavedPart::Norms => "Norms",
            SavedPart::PostNorms => "Post-norms",
            SavedPart::QkNorms => "Q/K norms",
            SavedPart::Attention => "Attention (q, k, v, output)",
            SavedPart::AttentionScores => "Attention scores (seq × seq)",
            SavedPart::Masks => "Sliding-window masks",
            SavedPart::SoftCapping => "Soft-capping buffers",
            SavedPart::Mlp => "MLP",
            SavedPart::Dropout => "Dropout masks",
            SavedPart::HeadAndLoss => "Logits and loss",
            SavedPart::WeightCopies => "Autocast weight copies",
            SavedPart::LayerInputs => "Checkpointed layer inputs",
            SavedPart::WorkingSet => "Forward working set (no-grad)",
        }
    }

    const fn index(self) -> usize {
        self as usize
    }
}

/// Bytes saved per [`SavedPart`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct PartBytes(pub [u64; 14]);

impl PartBytes {
    pub fn add(&mut self, part: SavedPart, bytes: u64) -> Res<()> {
        let slot = &mut self.0[part.index()];
        *slot = add(*slot, bytes)?;
        Ok(())
    }
    pub fn merge(&mut self, other: &PartBytes) -> Res<()> {
        for part in SavedPart::ALL {
            self.add(part, other.0[part.index()])?;
        }
        Ok(())
    }
    /// The non-zero parts, in display order.
    pub fn listed(&self) -> Vec<(SavedPart, u64)> {
        SavedPart::ALL
            .into_iter()
            .map(|p| (p, self.get(p)))
            .filter(|(_, b)| *b > 0)
            .collect()
    }
    pub fn get(&self, part: SavedPart) -> u64 {
        self.0[part.index()]
    }
}

/// The saved tensors of a forward pass.
pub(crate) struct Tape {
    pub tokens: u64,
    /// What the tensors saved now are for.
    pub part: SavedPart,
    pub parts: PartBytes,
    saved: Vec<bool>,
    total: u64,
}

impl Tape {
    pub fn new(tokens: u64) -> Self {
        Tape {
            tokens,
            part: SavedPart::Embeddings,
            parts: PartBytes::default(),
            saved: Vec::new(),
            total: 0,
        }
    }
    /// A new tensor of `width` elements per token.
    pub fn tensor(&mut self, width: u64, bytes: u64) -> Res<T> {
        self.raw(mul(self.tokens, width)?, bytes)
    }
    /// A new tensor of `elems` elements in all.
    pub fn raw(&mut self, elems: u64, bytes: u64) -> Res<T> {
        self.saved.push(false);
        Ok(T {
            id: self.saved.len() - 1,
            elems,
            bytes,
        })
    }
    /// Keeps `t` for backward (once, however many ops keep it).
    pub fn save(&mut self, t: T) -> Res<()> {
        if let Some(s) = self.saved.get_mut(t.id) {
            if !*s {
                *s = true;
                let bytes = storage(t.elems, t.bytes)?;
                self.total = add(self.total, bytes)?;
                self.parts.add(self.part, bytes)?;
            }
        }
        Ok(())
    }
    /// A new tensor saved at once.
    pub fn saved(&mut self, width: u64, bytes: u64) -> Res<T> {
        let t = self.tensor(width, bytes)?;
        self.save(t)?;
        Ok(t)
    }
    /// `t.to(dtype)`: the same tensor when the dtype is already right (`to` is then a no-op).
    pub fn cast(&mut self, t: T, bytes: u64) -> Res<T> {
        if t.bytes == bytes {
            Ok(t)
        } else {
            self.raw(t.elems, bytes)
        }
    }
    /// A new tensor shaped like `t`.
    pub fn like(&mut self, t: T, bytes: u64) -> Res<T> {
        self.raw(t.elems, bytes)
    }
    /// Bytes saved so far.
    pub fn total(&self) -> u64 {
        self.total
    }
}

/// `nn.Linear` (or GPT-2's `Conv1D`, the same `addmm`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Linear {
    pub n_in: u64,
    pub n_out: u64,
    pub bias: bool,
}

impl Linear {
    pub const fn new(n_in: u64, n_out: u64, bias: bool) -> Self {
        Linear { n_in, n_out, bias }
    }
    pub fn params(&self, out: &mut Vec<u64>) {
        out.push(self.n_in * self.n_out);
        if self.bias {
            out.push(self.n_out);
        }
    }
    /// Keeps its input (under autocast its own 16-bit cast of it: activation casts are not
    /// cached, only weights are) and returns its output in the activations' dtype.
    pub fn forward(&self, tape: &mut Tape, x: T, d: Dtypes) -> Res<T> {
        let kept = if d.amp { tape.cast(x, 2)? } else { x };
        tape.save(kept)?;
        tape.tensor(self.n_out, d.act)
    }
}

/// How an RMSNorm computes (the families differ in where they cast).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum RmsStyle {
    /// `weight * (x32 * rsqrt).to(input_dtype)` (Llama, Qwen, Mistral, Phi-3, Granite, SmolLM3).
    Llama,
    /// `(x32 * rsqrt) * (1 + weight.float())`, then `type_as(x)` (Gemma).
    Gemma,
    /// `(weight * (x32 * rsqrt)).to(input_dtype)` (OLMo 2).
    Olmo2,
}

/// The kind of a normalisation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum NormKind {
    /// `nn.LayerNorm` with weight and bias.
    LayerNorm,
    /// RMSNorm with a weight.
    Rms(RmsStyle),
}

/// A normalisation over `width` elements, `rows` times per token (per-head q/k norms).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Norm {
    pub kind: NormKind,
    pub width: u64,
    pub rows: u64,
}

impl Norm {
    pub const fn new(kind: NormKind, width: u64) -> Self {
        Norm {
            kind,
            width,
            rows: 1,
        }
    }
    pub fn params(&self, out: &mut Vec<u64>) {
        out.push(self.width);
        if self.kind == NormKind::LayerNorm {
            out.push(self.width);
        }
    }
    pub fn forward(&self, tape: &mut Tape, x: T, d: Dtypes) -> Res<T> {
        match self.kind {
            NormKind::LayerNorm => {
                // on CUDA autocast's fp32 list: the input is cast up first
                let input = if d.amp { tape.cast(x, 4)? } else { x };
                tape.save(input)?;
                tape.saved(self.rows, 4)?; // mean
                tape.saved(self.rows, 4)?; // rstd
                tape.like(x, if d.amp { 4 } else { x.bytes })
            }
            NormKind::Rms(style) => {
                let x32 = tape.cast(x, 4)?;
                tape.save(x32)?; // pow and the rsqrt product keep it
                tape.saved(self.rows, 4)?; // rsqrt
                let normed32 = tape.like(x, 4)?;
                match style {
                    RmsStyle::Llama => {
                        let normed = tape.cast(normed32, x.bytes)?;
                        tape.save(normed)?; // the weight product keeps it
                        tape.like(x, x.bytes.max(d.weight))
                    }
                    RmsStyle::Gemma => {
                        tape.save(normed32)?;
                        tape.raw(self.width, 4).and_then(|w| tape.save(w))?; // 1 + weight
                        let out32 = tape.like(x, 4)?;
                        tape.cast(out32, x.bytes)
                    }
                    RmsStyle::Olmo2 => {
                        tape.save(normed32)?;
                        let out32 = tape.like(x, 4)?;
                        tape.cast(out32, x.bytes)
                    }
                }
            }
        }
    }
}

/// The activation function of an MLP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Activation {
    /// SiLU, exact GELU or GELU tanh as one kernel: keeps its input.
    Kernel,
    /// GPT-2's `gelu_new` written out in Python: `0.5 * x * (1 + tanh(c * (x + 0.044715 x^3)))`.
    PythonGeluTanh,
}

impl Activation {
    pub fn forward(self, tape: &mut Tape, x: T, d: Dtypes) -> Res<T> {
        match self {
            Activation::Kernel => {
                tape.save(x)?;
                tape.like(x, x.bytes)
            }
            Activation::PythonGeluTanh => {
                // pow runs in fp32 under autocast (its cast input is kept); tanh, 0.5 x and
                // 1 + tanh are kept by their products
                let wide = if d.amp { 4 } else { x.bytes };
                let powed = tape.cast(x, wide)?;
                tape.save(powed)?;
                let t = tape.like(x, wide)?;
                tape.save(t)?;
                let half = tape.like(x, x.bytes)?;
                tape.save(half)?;
                let one_plus = tape.like(x, wide)?;
                tape.save(one_plus)?;
                tape.like(x, wide.max(x.bytes))
            }
        }
    }
}

/// Dropout in training: a 1-byte mask kept for backward.
pub(crate) fn dropout(tape: &mut Tape, x: T, on: bool) -> Res<T> {
    if !on {
        return Ok(x);
    }
    let part = std::mem::replace(&mut tape.part, SavedPart::Dropout);
    let mask = tape.like(x, 1)?;
    tape.save(mask)?;
    tape.part = part;
    tape.like(x, x.bytes)
}

/// A residual add: a new tensor in the wider dtype, nothing kept.
pub(crate) fn residual(tape: &mut Tape, a: T, b: T) -> Res<T> {
    tape.like(a, a.bytes.max(b.bytes))
}

/// The MLP of a layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum MlpKind {
    /// `down(act(gate(x)) * up(x))`, gate and up fused in one projection or separate.
    Gated { fused: bool },
    /// `proj(act(fc(x)))`.
    Plain,
}

/// An MLP block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Mlp {
    pub kind: MlpKind,
    pub hidden: u64,
    pub inner: u64,
    pub bias: bool,
    pub act: Activation,
}

impl Mlp {
    fn linears(&self) -> Vec<Linear> {
        let (h, i, b) = (self.hidden, self.inner, self.bias);
        match self.kind {
            MlpKind::Gated { fused: true } => vec![Linear::new(h, 2 * i, b), Linear::new(i, h, b)],
            MlpKind::Gated { fused: false } => vec![
                Linear::new(h, i, b),
                Linear::new(h, i, b),
                Linear::new(i, h, b),
            ],
            MlpKind::Plain => vec![Linear::new(h, i, b), Linear::new(i, h, b)],
        }
    }
    pub fn params(&self, out: &mut Vec<u64>) {
        for l in self.linears() {
            l.params(out);
        }
    }
    /// The weight matrices alone (what autocast's cast cache keeps: not the biases).
    pub fn weights(&self, out: &mut Vec<u64>) {
        out.extend(self.linears().iter().map(|l| l.n_in * l.n_out));
    }
    /// The output projection (its gradient is among the first of backward).
    pub fn down(&self) -> Linear {
        Linear::new(self.inner, self.hidden, self.bias)
    }
    pub fn forward(&self, tape: &mut Tape, x: T, d: Dtypes) -> Res<T> {
        let (h, i, b) = (self.hidden, self.inner, self.bias);
        let inner = match self.kind {
            MlpKind::Gated { fused } => {
                let (gate, up) = if fused {
                    let gate_up = Linear::new(h, 2 * i, b).forward(tape, x, d)?;
                    (gate_up, gate_up) // chunks are views of one storage
                } else {
                    (
                        Linear::new(h, i, b).forward(tape, x, d)?,
                        Linear::new(h, i, b).forward(tape, x, d)?,
                    )
                };
                // act(gate) keeps gate, the product keeps act(gate) and up; chunks of a fused
                // projection are views, so they keep its whole storage
                tape.save(gate)?;
                let a = tape.tensor(i, gate.bytes)?;
                tape.save(a)?;
                tape.save(up)?;
                tape.tensor(i, a.bytes)?
            }
            MlpKind::Plain => {
                let f = Linear::new(h, i, b).forward(tape, x, d)?;
                self.act.forward(tape, f, d)?
            }
        };
        self.down().forward(tape, inner, d)
    }
    /// Tensors of `tokens x inner` alive together inside a no-grad forward.
    pub fn inference_inner_tensors(&self) -> u64 {
        match self.kind {
            MlpKind::Gated { fused: true } => 4,
            MlpKind::Gated { fused: false } => 3,
            MlpKind::Plain => 2,
        }
    }
}
