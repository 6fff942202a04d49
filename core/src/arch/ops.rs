//! The op kinds a model is built from, each owning its rules: the parameters it holds, what
//! autograd saves for backward in each precision recipe, and the tensors it creates.
//!
//! A forward pass is emulated on a [`Tape`]: every op takes tensor handles, creates new
//! tensors and marks the ones its backward keeps. A tensor saved by several ops (a norm's
//! output read by three projections) counts once, as PyTorch keeps one storage; a view
//! (a slice of a fused projection) is the same tensor as its base.

use super::peft::{Role, TapePeft};

pub(crate) use super::arith::{add, mul, storage, sum_storages, Res, TooLarge, BLOCK};

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
    /// Elements of this tensor (of the view, for a view).
    pub elems: u64,
    pub bytes: u64,
    /// Elements of its storage (more than `elems` for a slice of a wider tensor).
    storage_elems: u64,
}

impl T {
    /// A view of the first `elems` elements per row of this tensor: the same storage.
    pub fn view(self, elems: u64) -> T {
        T { elems, ..self }
    }
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
    /// Sliding-window masks the kernel keeps (and eager attention's masks, which
    /// checkpointing keeps among the layers' arguments).
    Masks,
    /// Soft-capping's tanh outputs (Gemma 2).
    SoftCapping,
    /// MLP inputs and intermediates.
    Mlp,
    /// 1-byte dropout masks.
    Dropout,
    /// LoRA adapters' inputs (cast to their dtype), dropout masks and rank-r outputs.
    Adapters,
    /// The final norm, the logits and the loss.
    HeadAndLoss,
    /// Autocast's 16-bit copies of the weights.
    WeightCopies,
    /// The layer inputs that checkpointing keeps.
    LayerInputs,
    /// Offloaded tensors whose copy to CPU memory is still in flight (torchtune's stash).
    InFlight,
    /// The largest set of tensors alive at once in a no-grad forward.
    WorkingSet,
    /// A vision-language model's tower and projector, and what the language model keeps
    /// for the images (the merge mask, Mllama's cross-attention over the vision states).
    #[cfg(feature = "vision")]
    Vision,
}

impl SavedPart {
    /// Every part, in the order the breakdown lists them.
    pub const ALL: [SavedPart; if cfg!(feature = "vision") { 17 } else { 16 }] = [
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
        SavedPart::Adapters,
        SavedPart::HeadAndLoss,
        SavedPart::WeightCopies,
        SavedPart::LayerInputs,
        SavedPart::InFlight,
        SavedPart::WorkingSet,
        #[cfg(feature = "vision")]
        SavedPart::Vision,
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
            SavedPart::Adapters => "adapters",
            SavedPart::HeadAndLoss => "head-loss",
            SavedPart::WeightCopies => "weight-copies",
            SavedPart::LayerInputs => "layer-inputs",
            SavedPart::InFlight => "in-flight",
            SavedPart::WorkingSet => "working-set",
            #[cfg(feature = "vision")]
            SavedPart::Vision => "vision",
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
            SavedPart::Masks => "Attention masks (window, padding, packing)",
            SavedPart::SoftCapping => "Soft-capping buffers",
            SavedPart::Mlp => "MLP",
            SavedPart::Dropout => "Dropout masks",
            SavedPart::Adapters => "LoRA adapters",
            SavedPart::HeadAndLoss => "Logits and loss",
            SavedPart::WeightCopies => "Autocast weight copies",
            SavedPart::LayerInputs => "Checkpointed layer inputs",
            SavedPart::InFlight => "Offloaded, still on the GPU (copies in flight)",
            SavedPart::WorkingSet => "Forward working set (no-grad)",
            #[cfg(feature = "vision")]
            SavedPart::Vision => "Vision tower, projector and image tokens",
        }
    }

    const fn index(self) -> usize {
        self as usize
    }
}

/// Bytes saved per [`SavedPart`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct PartBytes(pub [u64; SavedPart::ALL.len()]);

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
    /// Takes `other`'s bytes away, part by part (never below zero).
    pub fn remove(&mut self, other: &PartBytes) {
        for (mine, theirs) in self.0.iter_mut().zip(other.0) {
            *mine = mine.saturating_sub(theirs);
        }
    }
}

/// The saved tensors of a forward pass.
pub(crate) struct Tape {
    pub tokens: u64,
    /// What the tensors saved now are for.
    pub part: SavedPart,
    pub parts: PartBytes,
    /// Each tensor's storage bytes and whether backward keeps it, in the order the tensors
    /// were made (the allocator replay reads them: `estimate::replay`).
    made: Vec<(u64, bool)>,
    total: u64,
    /// LoRA / QLoRA: the base is frozen and some linears carry adapters.
    pub peft: Option<TapePeft>,
    /// The role of the linear that runs next (which adapters pick).
    pub role: Role,
    /// Whether the tensors flowing now need a gradient (with a frozen base, not until the
    /// first adapter, unless checkpointing made the embeddings' output require one).
    pub grad: bool,
    /// The ops run inside a `torch.compile` graph: what they save is AOTAutograd's min-cut
    /// partitioner's choice (`validation/COMPILE.md`), which the norms, the activations and
    /// the MLP consult.
    pub compiled: bool,
    /// Compiled residual sums and the addend kept in their place (the partitioner
    /// recomputes a sum from the stream, kept already, and the sub-block's output).
    recomputed: Vec<(usize, T)>,
    /// Casts made in a compiled graph, by source and dtype: the graph computes one cast
    /// however many ops read it (autocast's per-linear copies of one input become one).
    casts: Vec<(usize, u64, T)>,
}

impl Tape {
    pub fn new(tokens: u64) -> Self {
        Tape {
            tokens,
            part: SavedPart::Embeddings,
            parts: PartBytes::default(),
            // a layer makes a few dozen tensors: room for them from the start spares the
            // vector's growth, step by step, on every tape of every estimate
            made: Vec::with_capacity(64),
            total: 0,
            peft: None,
            role: Role::Other,
            grad: true,
            compiled: false,
            recomputed: Vec::new(),
            casts: Vec::new(),
        }
    }
    /// A new tensor of `width` elements per token.
    pub fn tensor(&mut self, width: u64, bytes: u64) -> Res<T> {
        self.raw(mul(self.tokens, width)?, bytes)
    }
    /// A new tensor of `elems` elements in all.
    pub fn raw(&mut self, elems: u64, bytes: u64) -> Res<T> {
        self.made.push((storage(elems, bytes)?, false));
        Ok(T {
            id: self.made.len() - 1,
            elems,
            bytes,
            storage_elems: elems,
        })
    }
    /// Keeps `t` for backward (once, however many ops keep it).
    pub fn save(&mut self, t: T) -> Res<()> {
        if !self.grad {
            return Ok(()); // nothing before it needs a gradient: autograd records nothing
        }
        if let Some(&(_, addend)) = self.recomputed.iter().find(|(id, _)| *id == t.id) {
            return self.save(addend);
        }
        if let Some((_, s)) = self.made.get_mut(t.id) {
            if !*s {
                *s = true;
                let bytes = storage(t.storage_elems, t.bytes)?;
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
    /// A compiled residual sum `sum` whose addend is recomputed too: an op that keeps the sum
    /// keeps `stand_in` (a tensor kept already, so nothing more) instead of the addend.
    pub fn recompute_sum_from(&mut self, sum: T, stand_in: T) {
        if let Some(entry) = self.recomputed.iter_mut().find(|(id, _)| *id == sum.id) {
            entry.1 = stand_in;
        }
    }
    /// `t.to(dtype)`: the same tensor when the dtype is already right (`to` is then a no-op).
    pub fn cast(&mut self, t: T, bytes: u64) -> Res<T> {
        if t.bytes == bytes {
            return Ok(t);
        }
        if !self.compiled {
            return self.raw(t.elems, bytes);
        }
        if let Some(&(_, _, c)) = self
            .casts
            .iter()
            .find(|(id, b, _)| *id == t.id && *b == bytes)
        {
            return Ok(c);
        }
        let c = self.raw(t.elems, bytes)?;
        self.casts.push((t.id, bytes, c));
        Ok(c)
    }
    /// A new tensor shaped like `t`.
    pub fn like(&mut self, t: T, bytes: u64) -> Res<T> {
        self.raw(t.elems, bytes)
    }
    /// Bytes saved so far.
    pub fn total(&self) -> u64 {
        self.total
    }
    /// Every tensor made so far: its storage bytes and whether backward keeps it.
    pub fn log(&self) -> Vec<(u64, bool)> {
        self.made.clone()
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
    /// [`forward`](Self::forward) as the linear of `role`.
    pub fn run(&self, role: Role, tape: &mut Tape, x: T, d: Dtypes) -> Res<T> {
        tape.role = role;
        self.forward(tape, x, d)
    }
    pub fn forward(&self, tape: &mut Tape, x: T, d: Dtypes) -> Res<T> {
        let role = std::mem::replace(&mut tape.role, Role::Other);
        let Some(p) = tape.peft else {
            let kept = if d.amp { tape.cast(x, 2)? } else { x };
            tape.save(kept)?;
            return tape.tensor(self.n_out, d.act);
        };
        // the frozen base keeps no input: its weight needs no gradient
        if p.targets.contains(role) && role != Role::Head {
            let part = std::mem::replace(&mut tape.part, SavedPart::Adapters);
            // the adapters' saves do not wait for the input to need a gradient
            tape.grad = true;
            // peft casts the input to the adapters' dtype (a copy of its own per linear when
            // the dtypes differ; bitsandbytes' LoRA layer skips it under autocast), and under
            // autocast lora_A's matmul casts that to 16 bits: a copy of its own again
            let amp = d.amp || p.autocast;
            let x_in = if amp && p.quantized {
                x
            } else {
                tape.cast(x, p.adapter_bytes)?
            };
            let dropped = if p.dropout {
                let mask = tape.like(x_in, 1)?;
                tape.save(mask)?;
                tape.like(x_in, x_in.bytes)?
            } else {
                x_in
            };
            let kept = if amp { tape.cast(dropped, 2)? } else { dropped };
            tape.save(kept)?;
            let a_bytes = if amp { 2 } else { p.adapter_bytes };
            tape.saved(p.rank, a_bytes)?; // lora_A's output, kept by lora_B
            tape.part = part;
        }
        // bitsandbytes returns a 4-bit linear's output in its input's dtype
        let out = if p.quantized && role != Role::Head {
            x.bytes
        } else {
            d.act
        };
        tape.tensor(self.n_out, out)
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
        // a frozen weight needs no gradient, so its product keeps no normalised input
        let frozen = tape.peft.is_some();
        if tape.compiled {
            return self.forward_compiled(tape, x, d);
        }
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
                        if !frozen {
                            tape.save(normed)?; // the weight product keeps it
                        }
                        tape.like(x, x.bytes.max(d.weight))
                    }
                    RmsStyle::Gemma => {
                        if !frozen {
                            tape.save(normed32)?;
                        }
                        tape.raw(self.width, 4).and_then(|w| tape.save(w))?; // 1 + weight
                        let out32 = tape.like(x, 4)?;
                        tape.cast(out32, x.bytes)
                    }
                    RmsStyle::Olmo2 => {
                        if !frozen {
                            tape.save(normed32)?;
                        }
                        let out32 = tape.like(x, 4)?;
                        tape.cast(out32, x.bytes)
                    }
                }
            }
        }
    }
}

impl Norm {
    /// A norm inside a compiled graph (measured on Llama, Qwen3 and GPT-2,
    /// `validation/COMPILE.md`): the partitioner keeps the norm's input in its own dtype and
    /// the per-row statistics, and recomputes the normalised value in backward; no fp32
    /// upcast of the input and no normalised copy before the weight are kept. The output is
    /// kept by whatever reads it (the projections keep their input). RMSNorm's rstd is fp32;
    /// LayerNorm's mean and rstd come out of the decomposition in the dtype it computes in
    /// (the input's, fp32 after autocast's cast). Unsloth's `fast_rms_layernorm` keeps the
    /// same: its input and the fp32 `r` (`Fast_RMS_Layernorm.forward`).
    pub(crate) fn forward_compiled(&self, tape: &mut Tape, x: T, d: Dtypes) -> Res<T> {
        match self.kind {
            NormKind::LayerNorm => {
                let input = if d.amp { tape.cast(x, 4)? } else { x };
                tape.save(input)?;
                tape.saved(self.rows, input.bytes)?; // mean
                tape.saved(self.rows, input.bytes)?; // rstd
                tape.like(x, input.bytes)
            }
            NormKind::Rms(style) => {
                tape.save(x)?;
                tape.saved(self.rows, 4)?; // rstd
                match style {
                    RmsStyle::Llama => tape.like(x, x.bytes.max(d.weight)),
                    RmsStyle::Gemma | RmsStyle::Olmo2 => tape.like(x, x.bytes),
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
    /// ReLU (OPT): its backward reads its output, which the next linear keeps anyway; its
    /// input is not kept.
    Relu,
}

impl Activation {
    pub fn forward(self, tape: &mut Tape, x: T, d: Dtypes) -> Res<T> {
        match self {
            Activation::Kernel => {
                tape.save(x)?;
                tape.like(x, x.bytes)
            }
            Activation::Relu => {
                let y = tape.like(x, x.bytes)?;
                tape.save(y)?;
                Ok(y)
            }
            Activation::PythonGeluTanh if tape.compiled => {
                // one fused pointwise kernel: only its input is kept, the tanh chain is
                // recomputed in backward (GPT-2's gelu_new, measured)
                tape.save(x)?;
                let wide = if d.amp { 4 } else { x.bytes };
                tape.like(x, wide.max(x.bytes))
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

/// A residual add `a + b` (`a` the stream, `b` the sub-block's output): a new tensor in the
/// wider dtype, nothing kept. Compiled, the partitioner recomputes the sum in backward: an
/// op that keeps it keeps `b` instead (measured on Llama: o_proj's output in place of the
/// sum the second norm reads, 16-bit under autocast where the sum is fp32).
pub(crate) fn residual(tape: &mut Tape, a: T, b: T) -> Res<T> {
    let sum = tape.like(a, a.bytes.max(b.bytes))?;
    if tape.compiled {
        tape.recomputed.push((sum.id, b));
    }
    Ok(sum)
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
    /// `proj(act(fc(x)))` with biases (GPT-2, BERT, ViT).
    pub const fn plain(hidden: u64, inner: u64, act: Activation) -> Self {
        Mlp {
            kind: MlpKind::Plain,
            hidden,
            inner,
            bias: true,
            act,
        }
    }
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
    /// The linears with their roles, in `linears` order.
    pub fn roled_linears(&self) -> Vec<(Role, Linear)> {
        let roles: &[Role] = match self.kind {
            MlpKind::Gated { fused: true } => &[Role::GateUp, Role::Down],
            MlpKind::Gated { fused: false } => &[Role::Gate, Role::Up, Role::Down],
            MlpKind::Plain => &[Role::Fc, Role::Down],
        };
        roles.iter().copied().zip(self.linears()).collect()
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
                    let gate_up = Linear::new(h, 2 * i, b).run(Role::GateUp, tape, x, d)?;
                    (gate_up, gate_up) // chunks are views of one storage
                } else {
                    (
                        Linear::new(h, i, b).run(Role::Gate, tape, x, d)?,
                        Linear::new(h, i, b).run(Role::Up, tape, x, d)?,
                    )
                };
                // act(gate) keeps gate, the product keeps act(gate) and up; chunks of a fused
                // projection are views, so they keep its whole storage
                // (compiled: act(gate) is recomputed from the kept gate, measured on Llama)
                tape.save(gate)?;
                let a = tape.tensor(i, gate.bytes)?;
                if !tape.compiled {
                    tape.save(a)?;
                }
                tape.save(up)?;
                tape.tensor(i, a.bytes)?
            }
            MlpKind::Plain => {
                let f = Linear::new(h, i, b).run(Role::Fc, tape, x, d)?;
                self.act.forward(tape, f, d)?
            }
        };
        self.down().run(Role::Down, tape, inner, d)
    }
    /// Tensors of `tokens x inner` alive together inside a no-grad forward.
    /// Intermediate-sized tensors alive at once inside the MLP's backward: for a gated MLP
    /// two (the gradient of the activation's output, then of the gate and the up projection
    /// in turn; measured on Llama 3.2, Qwen3 and Gemma 3 with a chunked loss, where this
    /// moment is the step's peak), one for a plain MLP.
    pub fn backward_inner_tensors(&self) -> u64 {
        match self.kind {
            MlpKind::Gated { .. } => 2,
            MlpKind::Plain => 1,
        }
    }
    pub fn inference_inner_tensors(&self) -> u64 {
        match self.kind {
            MlpKind::Gated { fused: true } => 4,
            MlpKind::Gated { fused: false } => 3,
            MlpKind::Plain => 2,
        }
    }
}

/// How a mixture of experts routes tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Router {
    /// A linear router, fp32 softmax over the experts, top-k (Mixtral, Qwen-MoE); with
    /// `norm_topk` the k weights are renormalised; `weights_fp32` keeps them in fp32
    /// (Mixtral) instead of the logits' dtype.
    Softmax { norm_topk: bool, weights_fp32: bool },
    /// Top-k on the logits, then a softmax over the k in the logits' dtype (gpt-oss).
    TopkSoftmax,
    /// DeepSeek-V3: the router runs on an fp32 copy of its input, sigmoid scores in fp32,
    /// group-limited top-k, renormalised fp32 weights.
    SigmoidGrouped {
        groups: u64,
        topk_groups: u64,
        norm_topk: bool,
    },
}

/// The activation of the routed experts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum ExpertAct {
    /// `act(gate) * up` on the fused gate/up output.
    Glu,
    /// gpt-oss: `(clamp(up) + 1) * clamp(gate) * sigmoid(alpha * clamp(gate))`.
    ClampedSwiglu,
}

/// A mixture-of-experts block with transformers' default grouped experts (`grouped_mm`: the
/// tokens are sorted by expert and every expert runs on its rows; no per-expert loop, so the
/// memory does not depend on how tokens are routed).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Moe {
    pub hidden: u64,
    pub experts: u64,
    pub top_k: u64,
    /// Inner width of one expert.
    pub inner: u64,
    pub router: Router,
    pub router_bias: bool,
    pub expert_bias: bool,
    pub act: ExpertAct,
    /// Inner width of the always-on shared expert(s), 0 for none.
    pub shared_inner: u64,
    /// A sigmoid gate on the shared expert's output (Qwen2-MoE).
    pub shared_gate: bool,
}

impl Moe {
    fn shared(&self) -> Option<Mlp> {
        (self.shared_inner > 0).then_some(Mlp {
            kind: MlpKind::Gated { fused: false },
            hidden: self.hidden,
            inner: self.shared_inner,
            bias: false,
            act: Activation::Kernel,
        })
    }
    fn router(&self) -> Linear {
        Linear::new(self.hidden, self.experts, self.router_bias)
    }
    /// Element counts of the parameter tensors: the router, the experts' fused gate/up and
    /// down tensors (one 3-D tensor each, with their biases), the shared expert and its gate.
    pub fn params(&self, out: &mut Vec<u64>) {
        let (h, e, i) = (self.hidden, self.experts, self.inner);
        self.router().params(out);
        out.extend([e * 2 * i * h, e * h * i]);
        if self.expert_bias {
            out.extend([e * 2 * i, e * h]);
        }
        if let Some(s) = self.shared() {
            s.params(out);
        }
        if self.shared_gate {
            out.push(h);
        }
    }
    /// Parameters of the routed experts.
    /// The router, the shared expert's linears and its gate, with their roles.
    pub fn roled_linears(&self) -> Vec<(Role, Linear)> {
        let mut v = vec![(Role::Other, self.router())];
        if let Some(s) = self.shared() {
            v.extend(s.roled_linears());
        }
        if self.shared_gate {
            v.push((Role::Other, Linear::new(self.hidden, 1, false)));
        }
        v
    }
    pub fn routed_params(&self) -> u64 {
        let (h, e, i) = (self.hidden, self.experts, self.inner);
        e * (3 * i * h + if self.expert_bias { 2 * i + h } else { 0 })
    }
    /// Parameters one token uses: the router, k experts, the shared expert.
    pub fn active_params(&self) -> u64 {
        let mut all = Vec::new();
        self.params(&mut all);
        let total: u64 = all.iter().sum();
        let (h, e, i) = (self.hidden, self.experts, self.inner);
        let per_expert = 3 * i * h + if self.expert_bias { 2 * i + h } else { 0 };
        total - (e - self.top_k.min(e)) * per_expert
    }
    /// The matmul weights autocast casts: the router, the shared expert and its gate (the
    /// grouped experts run in their weights' dtype, outside autocast).
    pub fn weights(&self, out: &mut Vec<u64>) {
        out.push(self.hidden * self.experts);
        if let Some(s) = self.shared() {
            s.weights(out);
        }
        if self.shared_gate {
            out.push(self.hidden);
        }
    }
    pub fn forward(&self, tape: &mut Tape, x: T, d: Dtypes) -> Res<T> {
        let (h, e, k, i) = (self.hidden, self.experts, self.top_k, self.inner);
        let tokens = tape.tokens;
        let rows = mul(tokens, k)?;
        let saved = |tape: &mut Tape, elems: u64, bytes: u64| -> Res<()> {
            let t = tape.raw(elems, bytes)?;
            tape.save(t)
        };
        let routing_bytes = match self.router {
            Router::Softmax {
                norm_topk,
                weights_fp32,
            } => {
                self.router().forward(tape, x, d)?;
                saved(tape, mul(tokens, e)?, 4)?; // fp32 probabilities
                saved(tape, mul(tokens, k)?, 8)?; // top-k indices
                if norm_topk {
                    // compiled, the sum is recomputed from the kept top-k values (measured
                    // with inductor on a Qwen3-MoE config: validation/COMPILE.md)
                    if !tape.compiled {
                        saved(tape, tokens, 4)?; // their sum
                    }
                    saved(tape, mul(tokens, k)?, 4)?; // the top-k values, cloned by the division
                }
                if weights_fp32 {
                    4
                } else {
                    d.act
                }
            }
            Router::TopkSoftmax => {
                self.router().forward(tape, x, d)?;
                saved(tape, mul(tokens, k)?, 8)?;
                saved(tape, mul(tokens, k)?, d.act)?; // softmax over the k logits
                d.act
            }
            Router::SigmoidGrouped {
                groups,
                topk_groups,
                norm_topk,
            } => {
                // F.linear(x.float(), weight.float()): fp32, unless autocast casts it back
                let scores = if d.amp {
                    self.router().forward(tape, x, d)?;
                    d.act
                } else {
                    let x32 = tape.cast(x, 4)?;
                    tape.save(x32)?;
                    4
                };
                saved(tape, mul(tokens, e)?, scores)?; // sigmoid scores
                                                       // group scores, chosen groups and the expert mask stay referenced
                saved(tape, mul(tokens, mul(groups, 2)?)?, 8)?;
                saved(tape, mul(tokens, topk_groups)?, 8)?;
                saved(tape, mul(tokens, e)?, 1)?;
                saved(tape, mul(tokens, k)?, 8)?; // gather indices
                if norm_topk {
                    saved(tape, tokens, 4)?;
                    saved(tape, mul(tokens, k)?, scores)?;
                }
                scores
            }
        };
        // grouped experts: sorting permutations, offsets, the gathered rows, the fused
        // gate/up output and the activation, the routing weights per row, the down output
        let wd = d.weight;
        let index_tensors = if self.expert_bias { 4 } else { 3 };
        for _ in 0..index_tensors {
            saved(tape, rows, 8)?;
        }
        saved(tape, e, 4)?;
        saved(tape, mul(rows, h)?, wd)?;
        saved(tape, mul(rows, 2 * i)?, wd)?;
        // Compiled, the activation is one fused pointwise group from the kept gate/up output
        // to the down projection's input: the partitioner keeps that product (the grouped
        // matmul's backward reads it) and recomputes the rest in backward, eager's
        // `act(gate)` (Glu) or the clamps and the sigmoid (gpt-oss) included, as it does for a
        // dense MLP's silu (measured with inductor on a Qwen3-MoE config: only the product is
        // kept; gpt-oss's chain by the same rule, not measured)
        let act_tensors = match (self.act, tape.compiled) {
            (_, true) => 1,
            (ExpertAct::Glu, false) => 2,
            (ExpertAct::ClampedSwiglu, false) => 5,
        };
        for _ in 0..act_tensors {
            saved(tape, mul(rows, i)?, wd)?;
        }
        // the routing weights gathered per sorted row: compiled, an index of the kept top-k
        // weights by the kept permutation, recomputed in backward (measured as above)
        if !tape.compiled {
            saved(tape, rows, routing_bytes)?;
        }
        saved(tape, mul(rows, h)?, wd)?;
        if let Some(shared) = self.shared() {
            let out = shared.forward(tape, x, d)?;
            if self.shared_gate {
                Linear::new(h, 1, false).forward(tape, x, d)?;
                saved(tape, tokens, d.act)?; // sigmoid of the gate
                tape.save(out)?;
            }
        }
        tape.tensor(h, x.bytes)
    }
}

/// The feed-forward block of a layer: a dense MLP or a mixture of experts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum FeedForward {
    Dense(Mlp),
    Moe(Moe),
}

impl FeedForward {
    pub fn params(&self, out: &mut Vec<u64>) {
        match self {
            FeedForward::Dense(m) => m.params(out),
            FeedForward::Moe(m) => m.params(out),
        }
    }
    pub fn weights(&self, out: &mut Vec<u64>) {
        match self {
            FeedForward::Dense(m) => m.weights(out),
            FeedForward::Moe(m) => m.weights(out),
        }
    }
    pub fn forward(&self, tape: &mut Tape, x: T, d: Dtypes) -> Res<T> {
        match self {
            FeedForward::Dense(m) => m.forward(tape, x, d),
            FeedForward::Moe(m) => m.forward(tape, x, d),
        }
    }
    /// The output projection's parameters (its gradient is among the first of backward).
    pub fn down_params(&self, out: &mut Vec<u64>) {
        match self {
            FeedForward::Dense(m) => m.down().params(out),
            FeedForward::Moe(m) => {
                out.push(m.experts * m.hidden * m.inner);
                if let Some(s) = m.shared() {
                    s.down().params(out);
                }
            }
        }
    }
    /// Elements per token of the widest intermediate (the experts' rows count k times).
    pub fn inner_per_token(&self) -> u64 {
        match self {
            FeedForward::Dense(m) => m.inner,
            FeedForward::Moe(m) => (m.top_k * m.inner).max(m.shared_inner),
        }
    }
    /// The dense inner width, or the experts' (what `intermediate_size` means to a person).
    pub fn inner(&self) -> u64 {
        match self {
            FeedForward::Dense(m) => m.inner,
            FeedForward::Moe(m) => m.inner,
        }
    }
    /// Tensors of `tokens x inner_per_token` alive together inside a no-grad forward.
    /// See [`Mlp::backward_inner_tensors`]; a mixture of experts as before: one.
    pub fn backward_inner_tensors(&self) -> u64 {
        match self {
            FeedForward::Dense(m) => m.backward_inner_tensors(),
            FeedForward::Moe(_) => 1,
        }
    }
    pub fn inference_inner_tensors(&self) -> u64 {
        match self {
            FeedForward::Dense(m) => m.inference_inner_tensors(),
            FeedForward::Moe(_) => 4,
        }
    }
    /// Parameters one token uses.
    pub fn active_params(&self) -> u64 {
        match self {
            FeedForward::Dense(m) => {
                let mut v = Vec::new();
                m.params(&mut v);
                v.iter().sum()
            }
            FeedForward::Moe(m) => m.active_params(),
        }
    }
}
