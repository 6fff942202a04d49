//! A model as data: embeddings, a list of layers, the final norm, the head and the loss, each
//! built from the op kinds of [`super::ops`]. Family readers (`families.rs`) produce a
//! [`ModelSpec`]; the estimator (`estimate.rs`) runs it on a [`Tape`].

use super::loss::CausalHead;
use super::ops::{
    add, dropout, mul, residual, storage, Activation, ExpertAct, FeedForward, Linear, Norm,
    NormKind, PartBytes, Res, RmsStyle, SavedPart, Tape, TooLarge, T,
};
use super::peft::Role;
use super::replay::LossTensors;
use super::shape::StepShape;

/// Where a layer's norms sit around its two sub-blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Placement {
    /// `x + block(norm(x))` (Llama, GPT-2, ViT).
    Pre,
    /// `x + norm(block(norm(x)))` (Gemma 2 and 3: pre- and post-norms).
    Sandwich,
    /// `x + norm(block(x))` (OLMo 2: norms after the sub-blocks).
    Post,
    /// `norm(x + block(x))` (BERT, RoBERTa).
    PostResidual,
}

/// How the query/key norm of a layer normalises (Qwen3 and Gemma 3 per head, OLMo 2 over the
/// whole projection).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct QkNorm {
    pub style: RmsStyle,
    pub per_head: bool,
}

/// The attention implementation that runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kernel {
    Eager,
    Flash,
    Efficient,
    Math,
}

/// Multi-head latent attention (DeepSeek-V2/V3): queries through an optional low-rank
/// bottleneck, keys and values decompressed per head from one shared latent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Latent {
    pub q_rank: Option<u64>,
    pub kv_rank: u64,
    pub rope_dim: u64,
    pub nope_dim: u64,
}

/// A self-attention block: projections, optional q/k norm and rotary embedding, the kernel
/// and the output projection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Attention {
    pub hidden: u64,
    pub heads: u64,
    pub kv_heads: u64,
    /// Query/key head width (MLA: nope + rope dims).
    pub head_dim: u64,
    /// Value (and output) head width.
    pub v_head_dim: u64,
    /// One projection for q, k and v (GPT-2, ViT, Phi-3).
    pub fused_qkv: bool,
    pub qkv_bias: bool,
    pub o_bias: bool,
    pub qk_norm: Option<QkNorm>,
    /// Rotary dimensions per head; `None` for layers without rotary (learned positions, NoPE).
    pub rotary_dim: Option<u64>,
    /// Sliding window; `None` for full attention.
    pub window: Option<u64>,
    /// Soft-capping of the attention logits (eager only: SDPA has no such knob).
    pub softcap: bool,
    /// Learned attention sinks (gpt-oss, eager only): one more column in the softmax.
    pub sinks: bool,
    /// Dropout on the attention probabilities in training.
    pub probs_dropout: bool,
    /// The eager softmax runs in fp32 (HF's `softmax(..., dtype=float32)`).
    pub softmax_fp32: bool,
    /// The rotary product is cast back to q's dtype (OLMo 2 keeps fp32 tables).
    pub rope_keeps_dtype: bool,
    /// The rotary product is a `torch.cat` of the rotated and passed-through dims (Phi-3):
    /// q is then laid out head-major, and so is flash's output, which the output projection
    /// needs copied to token-major.
    pub rope_concat: bool,
    /// Multi-head latent attention instead of q/k/v projections.
    pub latent: Option<Latent>,
}

impl Attention {
    /// Multi-head attention as GPT-2, BERT and ViT have it: biases everywhere, no rotary, no
    /// grouping, no window, softmax in the scores' dtype.
    pub const fn classic(hidden: u64, heads: u64, head_dim: u64) -> Self {
        Attention {
            hidden,
            heads,
            kv_heads: heads,
            head_dim,
            v_head_dim: head_dim,
            fused_qkv: false,
            qkv_bias: true,
            o_bias: true,
            qk_norm: None,
            rotary_dim: None,
            window: None,
            softcap: false,
            sinks: false,
            probs_dropout: false,
            softmax_fp32: false,
            rope_keeps_dtype: false,
            rope_concat: false,
            latent: None,
        }
    }
    fn q_width(&self) -> u64 {
        self.heads * self.head_dim
    }
    fn kv_width(&self) -> u64 {
        self.kv_heads * self.head_dim
    }
    fn out_width(&self) -> u64 {
        self.heads * self.v_head_dim
    }
    pub fn linears(&self) -> Vec<Linear> {
        let (h, q, kv, b) = (self.hidden, self.q_width(), self.kv_width(), self.qkv_bias);
        // (room for the most there are, five: the output's push never grows it)
        let mut v = Vec::with_capacity(5);
        if let Some(l) = self.latent {
            if let Some(r) = l.q_rank {
                v.push(Linear::new(h, r, b));
                v.push(Linear::new(r, q, false));
            } else {
                v.push(Linear::new(h, q, false));
            }
            v.push(Linear::new(h, l.kv_rank + l.rope_dim, b));
            v.push(Linear::new(
                l.kv_rank,
                self.heads * (l.nope_dim + self.v_head_dim),
                false,
            ));
        } else if self.fused_qkv {
            v.push(Linear::new(h, q + 2 * kv, b));
        } else {
            v.push(Linear::new(h, q, b));
            v.push(Linear::new(h, kv, b));
            v.push(Linear::new(h, self.kv_heads * self.v_head_dim, b));
        }
        v.push(Linear::new(self.out_width(), h, self.o_bias));
        v
    }
    /// The linears with their roles, in [`linears`](Self::linears) order.
    pub fn roled_linears(&self) -> Vec<(Role, Linear)> {
        let linears = self.linears();
        let n = linears.len();
        linears
            .into_iter()
            .enumerate()
            .map(|(i, l)| {
                let role = if i + 1 == n {
                    Role::O
                } else if self.latent.is_some() {
                    Role::Other
                } else if self.fused_qkv {
                    Role::Qkv
                } else {
                    [Role::Q, Role::K, Role::V][i.min(2)]
                };
                (role, l)
            })
            .collect()
    }
    fn qk_norms(&self) -> Option<(Norm, Norm)> {
        self.qk_norm.map(|n| {
            let kind = NormKind::Rms(n.style);
            if n.per_head {
                (
                    Norm {
                        kind,
                        width: self.head_dim,
                        rows: self.heads,
                    },
                    Norm {
                        kind,
                        width: self.head_dim,
                        rows: self.kv_heads,
                    },
                )
            } else {
                (
                    Norm::new(kind, self.q_width()),
                    Norm::new(kind, self.kv_width()),
                )
            }
        })
    }
    pub fn params(&self, out: &mut Vec<u64>) {
        for l in self.linears() {
            l.params(out);
        }
        if let Some((q, k)) = self.qk_norms() {
            out.push(q.width);
            out.push(k.width);
        }
        if let Some(l) = self.latent {
            if let Some(r) = l.q_rank {
                out.push(r);
            }
            out.push(l.kv_rank);
        }
        if self.sinks {
            out.push(self.heads);
        }
    }
    /// Whether HF's `repeat_kv` copies k and v (transformers 5.24, `repeat_kv` in
    /// `models/*/modeling_*.py` and `integrations/sdpa_attention.py`):
    /// `x[:, :, None].expand(b, kv, n_rep, s, d).reshape(b, kv * n_rep, s, d)`. `reshape` is a
    /// view when the merged dims can share one stride (torch's `computeStride`,
    /// `aten/src/ATen/TensorUtils.cpp`): with one kv head the size-1 dim drops out and the
    /// result is a stride-0 view at any batch; with more, each kv head's stride against the
    /// repeats' 0 forces a copy.
    pub fn repeat_kv_copies(&self) -> bool {
        self.heads != self.kv_heads && self.kv_heads > 1
    }
    /// Whether backward keeps k and v for every query head as tensors of their own (not
    /// views of the projections): the math kernel repeats them itself (`repeat_interleave`);
    /// eager attention's `torch.matmul` on 4-D operands (`_matmul_impl`,
    /// `aten/src/ATen/native/LinearAlgebra.cpp`) reshapes each to `(batch * heads, s, d)` for
    /// the `bmm` that autograd saves, which copies a stride-0 head dim unless the batch is 1;
    /// flash and memory-efficient SDPA save what they are given, `repeat_kv`'s output on the
    /// paths where HF does not pass `enable_gqa` (a mask). Measured: a one-kv-head Gemma 3
    /// at batch 8 under eager and at batch 4 with SDPA and padding
    /// (`families-measured.jsonl`, `trainers-measured.jsonl`).
    pub fn saves_repeated_kv(&self, s: &StepShape) -> bool {
        if self.heads == self.kv_heads {
            return false;
        }
        match self.kernel(s) {
            Kernel::Math => true,
            Kernel::Eager => self.repeat_kv_copies() || s.batch > 1,
            Kernel::Flash | Kernel::Efficient => self.masked(s) && self.repeat_kv_copies(),
        }
    }
    /// Elements of the additive mask the memory-efficient kernel keeps: (batch, seq, seq)
    /// with the last dimension padded to a multiple of 8, broadcast over the heads.
    fn additive_mask(s: &StepShape) -> Res<u64> {
        mul(s.batch, mul(s.seq, s.seq.div_ceil(8).saturating_mul(8))?)
    }
    /// Whether the layers' attention of one type share one additive mask: compiled whole
    /// (and not checkpointed), the graph converts HF's bool mask, an input of every layer of
    /// that type, once (`where` is pure: the graph computes it once for all its readers) and
    /// the partitioner keeps that one tensor for every layer's backward (measured with
    /// inductor on a sliding-window Mistral config: validation/COMPILE.md). Per block, each
    /// block's graph converts it again and keeps its own, as eager does.
    pub fn shares_masks(s: &StepShape) -> bool {
        s.compile.whole_model() && !s.checkpointed
    }
    /// Whether HF passes a mask (it skips it, for `is_causal`, unless a sliding window is
    /// shorter than the keys).
    pub fn masked(&self, s: &StepShape) -> bool {
        !s.flash2 && (s.mask || self.window.is_some_and(|w| s.seq >= w))
    }
    /// The kernel PyTorch's CUDA dispatch picks on sm80+: flash for 16-bit inputs without a
    /// mask and with equal q/k and v head sizes (GQA allowed), memory-efficient otherwise
    /// (GQA allowed since PyTorch 2.14), and the math fallback for shapes neither takes.
    /// Soft-capping and sinks exist only in eager attention (transformers refuses SDPA).
    pub fn kernel(&self, s: &StepShape) -> Kernel {
        let (hd, vd) = (self.head_dim, self.v_head_dim);
        let align = if s.d.act == 2 { 8 } else { 4 };
        if s.eager || self.softcap || self.sinks {
            Kernel::Eager
        } else if s.flash2
            || s.d.act == 2 && hd == vd && hd.is_multiple_of(8) && hd <= 256 && !self.masked(s)
        {
            Kernel::Flash
        } else if hd.is_multiple_of(align) && vd.is_multiple_of(align) {
            Kernel::Efficient
        } else {
            Kernel::Math
        }
    }
    /// The q, k and v that the kernel reads (before its dtype casts and repeats).
    fn project(&self, tape: &mut Tape, x: T, s: &StepShape) -> Res<(T, T, T)> {
        let d = s.d;
        let (h, qw, kvw) = (self.hidden, self.q_width(), self.kv_width());
        if let Some(l) = self.latent {
            let q = match l.q_rank {
                Some(r) => {
                    let a = Linear::new(h, r, self.qkv_bias).forward(tape, x, d)?;
                    let a = Norm::new(NormKind::Rms(RmsStyle::Llama), r).forward(tape, a, d)?;
                    Linear::new(r, qw, false).forward(tape, a, d)?
                }
                None => Linear::new(h, qw, false).forward(tape, x, d)?,
            };
            // cat(q_pass, rope(q_rot)): a new query in the wider of the two dtypes
            let query = tape.tensor(qw, q.bytes.max(d.resid()))?;
            let kv_a = Linear::new(h, l.kv_rank + l.rope_dim, self.qkv_bias).forward(tape, x, d)?;
            let kv_nope = kv_a.view(tape.tokens.saturating_mul(l.kv_rank));
            let kv_nope =
                Norm::new(NormKind::Rms(RmsStyle::Llama), l.kv_rank).forward(tape, kv_nope, d)?;
            let kv_b = Linear::new(
                l.kv_rank,
                self.heads * (l.nope_dim + self.v_head_dim),
                false,
            )
            .forward(tape, kv_nope, d)?;
            // keys assembled per head in a new tensor; values are a view of kv_b's output
            let key = tape.tensor(qw, kv_b.bytes)?;
            return Ok((query, key, kv_b));
        }
        let (mut q, mut k, v) = if self.fused_qkv {
            let qkv = Linear::new(h, qw + 2 * kvw, self.qkv_bias).run(Role::Qkv, tape, x, d)?;
            (qkv, qkv, qkv) // views of one storage
        } else {
            (
                Linear::new(h, qw, self.qkv_bias).run(Role::Q, tape, x, d)?,
                Linear::new(h, kvw, self.qkv_bias).run(Role::K, tape, x, d)?,
                Linear::new(h, self.kv_heads * self.v_head_dim, self.qkv_bias).run(
                    Role::V,
                    tape,
                    x,
                    d,
                )?,
            )
        };
        if let Some((qn, kn)) = self.qk_norms() {
            tape.part = SavedPart::QkNorms;
            q = qn.forward(tape, q, d)?;
            k = kn.forward(tape, k, d)?;
            tape.part = SavedPart::Attention;
        }
        if self.rotary_dim.is_some() {
            // q * cos + rotate_half(q) * sin keeps cos and sin (shared), not q; the result
            // takes the wider of q's and the tables' dtype
            let (qb, kb) = if self.rope_keeps_dtype {
                (q.bytes, k.bytes)
            } else {
                (q.bytes.max(d.resid()), k.bytes.max(d.resid()))
            };
            q = tape.tensor(qw, qb)?;
            k = tape.tensor(kvw, kb)?;
        }
        Ok((q, k, v))
    }
    /// Bytes alive inside eager attention at its peak in a no-grad forward, beyond the layer's
    /// input and normed input (0 for the fused kernels, whose working set is the MLP's at
    /// most): q and k after the rotary embedding, v, HF's `repeat_kv` copies for grouped heads,
    /// and the largest set of score tensors. Read from transformers' `eager_attention_forward`
    /// and checked with `validation/peak_live.py`:
    /// `matmul(q, k^T) * scale + mask` (the mask is in the model's dtype, fp32 under
    /// autocast, which promotes the logits) stays referenced until the end; the softmax
    /// (fp32 where HF asks for it, or under autocast) converts its input first, and the
    /// result is cast back to the value's dtype while both live. With sinks (gpt-oss) the
    /// logits are concatenated with the sink column, the row max subtracted (the
    /// concatenation and the difference alive together), the softmax is one column wider and
    /// the slice without the sink is cast back.
    pub fn inference_live(&self, s: &StepShape) -> Res<u64> {
        if self.kernel(s) != Kernel::Eager {
            return Ok(0);
        }
        let d = s.d;
        let (w, r) = (d.act, d.resid());
        let tokens = mul(s.batch, s.seq)?;
        let (qw, kvw) = (self.q_width(), self.kv_width());
        let vw = self.kv_heads * self.v_head_dim;
        let rope = if self.rope_keeps_dtype { w } else { w.max(r) };
        let (qb, kb) = if self.rotary_dim.is_some() {
            (rope, rope)
        } else {
            (w, w)
        };
        let t = |width: u64, bytes: u64| storage(tokens, mul(width, bytes)?);
        let mut live = if self.fused_qkv {
            // q, k and v are views of the fused projection, which the rotary ones replace
            let qkv = t(qw + 2 * kvw, w)?;
            if self.rotary_dim.is_some() {
                add(qkv, add(t(qw, qb)?, t(kvw, kb)?)?)?
            } else {
                qkv
            }
        } else {
            add(add(t(qw, qb)?, t(kvw, kb)?)?, t(vw, w)?)?
        };
        // repeat_kv's copies, held by the attention function; one kv head's stride-0 view is
        // copied only inside each matmul, freed before the softmax (`validation/peak_live.py`:
        // Gemma 3 at batch 8)
        if self.repeat_kv_copies() {
            live = add(
                live,
                add(t(self.heads * self.head_dim, kb)?, t(self.out_width(), w)?)?,
            )?;
        }
        let rows = mul(mul(s.batch, self.heads)?, s.seq)?;
        let square = mul(rows, s.seq)?;
        // the masked logits: the mask's dtype promotes them
        let logits = w.max(r);
        let sm = if self.softmax_fp32 || d.amp {
            4
        } else {
            logits
        };
        let scores = if self.sinks {
            let wide = mul(rows, add(s.seq, 1)?)?;
            let a = storage(square, logits)?;
            let c = storage(wide, logits)?;
            // concatenation and difference, or difference and softmax (same dtype), then
            // the cast of the slice back to the value's dtype
            // (the softmax runs in the logits' dtype)
            let cast = if logits == w { 0 } else { storage(square, w)? };
            add(add(a, mul(c, 2)?)?, cast)?
        } else {
            let a = storage(square, logits)?;
            let p = storage(square, sm)?;
            let convert = if sm == logits { 0 } else { p };
            let cast = if sm == w { 0 } else { storage(square, w)? };
            add(add(a, p)?, convert.max(cast))?
        };
        add(live, scores)
    }
    /// Bytes of one eager attention mask: `(batch, 1, seq, seq)` in the model's dtype.
    pub fn eager_mask(s: &StepShape) -> Res<u64> {
        storage(mul(s.batch, mul(s.seq, s.seq)?)?, s.d.resid())
    }
    pub fn forward(&self, tape: &mut Tape, x: T, s: &StepShape) -> Res<T> {
        let d = s.d;
        tape.part = SavedPart::Attention;
        let (h, qw, ow) = (self.hidden, self.q_width(), self.out_width());
        let (q, k, v) = self.project(tape, x, s)?;
        let kernel = self.kernel(s);
        let w = d.act;
        let gqa = self.heads != self.kv_heads;
        let masked = self.masked(s);
        // k/v for every query head: the math kernel repeats them itself; HF's repeat_kv does
        // on the paths where it does not pass enable_gqa (eager, or SDPA with a mask); flash
        // and memory-efficient take grouped heads as they are. Where what is saved is
        // repeat_kv's stride-0 view, a cast to 16 bits copies it.
        let repeats = gqa
            && match kernel {
                Kernel::Math | Kernel::Eager => true,
                Kernel::Flash | Kernel::Efficient => masked,
            };
        let copied = self.saves_repeated_kv(s);
        let mut inputs = [q, k, v];
        for (t, width) in inputs[1..].iter_mut().zip([qw, ow]) {
            if copied {
                *t = tape.tensor(width, t.bytes)?;
            } else if repeats && t.bytes != w {
                *t = tape.tensor(width, w)?; // the cast of the view is a full copy
            }
        }
        // the kernel's inputs in the activations' dtype (SDPA and matmul are on autocast's
        // 16-bit list)
        for t in inputs {
            let c = tape.cast(t, w)?;
            tape.save(c)?;
        }
        let heads_rows = mul(s.batch, self.heads)?;
        let hs2 = mul(heads_rows, mul(s.seq, s.seq)?)?;
        match kernel {
            Kernel::Flash => {
                tape.raw(mul(heads_rows, s.seq)?, 4)
                    .and_then(|t| tape.save(t))?; // logsumexp
                if s.flash2 {
                    // flash-attn's rng_state: two int64
                    tape.raw(2, 8).and_then(|t| tape.save(t))?;
                }
            }
            Kernel::Efficient => {
                // (compiled whole, the layers share one: `ModelSpec::forward`)
                if masked && !Self::shares_masks(s) {
                    tape.part = SavedPart::Masks;
                    // SDPA turns HF's bool mask into an additive one in the query's dtype,
                    // per sample and broadcast over heads, in every layer; the efficient
                    // kernel pads its last dimension to a multiple of 8 and keeps it for
                    // backward
                    tape.raw(Self::additive_mask(s)?, w)
                        .and_then(|t| tape.save(t))?;
                    tape.part = SavedPart::Attention;
                }
                // the memory-efficient kernel pads its logsumexp to a multiple of 32
                let padded = s.seq.div_ceil(32).checked_mul(32);
                let padded = padded.ok_or(TooLarge)?;
                tape.raw(mul(heads_rows, padded)?, 4)
                    .and_then(|t| tape.save(t))?;
            }
            Kernel::Math => {
                tape.part = SavedPart::AttentionScores;
                tape.raw(hs2, w).and_then(|t| tape.save(t))?; // softmax output
                if self.probs_dropout {
                    tape.raw(hs2, 1).and_then(|t| tape.save(t))?;
                    tape.raw(hs2, w).and_then(|t| tape.save(t))?;
                }
            }
            Kernel::Eager => {
                if self.softcap {
                    tape.part = SavedPart::SoftCapping;
                    tape.raw(hs2, w).and_then(|t| tape.save(t))?; // tanh of the capped logits
                }
                tape.part = SavedPart::AttentionScores;
                if self.sinks {
                    // the sink column joins the logits; the row max's indices and the softmax
                    // (in the logits' dtype, fp32 under autocast; one column wider) are kept,
                    // and under autocast the 16-bit cast of its first columns
                    let rows = mul(heads_rows, s.seq)?;
                    tape.raw(rows, 8).and_then(|t| tape.save(t))?;
                    let sm = if d.amp { 4 } else { w };
                    tape.raw(mul(rows, add(s.seq, 1)?)?, sm)
                        .and_then(|t| tape.save(t))?;
                    if sm != w {
                        tape.raw(hs2, w).and_then(|t| tape.save(t))?;
                    }
                } else {
                    let sm = if d.amp || self.softmax_fp32 { 4 } else { w };
                    tape.raw(hs2, sm).and_then(|t| tape.save(t))?;
                    if self.probs_dropout {
                        tape.raw(hs2, 1).and_then(|t| tape.save(t))?;
                        tape.raw(hs2, w).and_then(|t| tape.save(t))?;
                    } else if sm != w {
                        tape.raw(hs2, w).and_then(|t| tape.save(t))?;
                    }
                }
            }
        }
        tape.part = SavedPart::Attention;
        let mut out = tape.tensor(ow, w)?;
        if matches!(kernel, Kernel::Flash | Kernel::Efficient) {
            tape.save(out)?; // the fused kernels' backward reads their output
        }
        // eager: Phi-3's rotary `torch.cat` makes q head-major, so is flash's output, and
        // `transpose(1, 2).reshape` copies it token-major for the output projection, which
        // keeps the copy. Compiled, nothing of it is kept: the graph drops the `torch.cat`
        // whose pass-through part is empty (full rotary) and q stays a view of the projection's
        // token-major output (measured with inductor on a Phi-3 config: validation/COMPILE.md).
        // With a partial rotary the cat is real, but the copy is then a pointwise function of
        // flash's output, which the backward keeps anyway: the partitioner recomputes it.
        if kernel == Kernel::Flash
            && self.rope_concat
            && self.rotary_dim.is_some()
            && !tape.compiled
        {
            tape.save(out)?;
            out = tape.tensor(ow, w)?;
        }
        Linear::new(ow, h, self.o_bias).run(Role::O, tape, out, d)
    }
}

/// One transformer layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Layer {
    pub attention: Attention,
    pub mlp: FeedForward,
    pub norm: NormKind,
    pub placement: Placement,
    /// Dropout after each sub-block in training.
    pub hidden_dropout: bool,
}

impl Layer {
    fn norm(&self) -> Norm {
        Norm::new(self.norm, self.attention.hidden)
    }
    fn norm_count(&self) -> usize {
        if self.placement == Placement::Sandwich {
            4
        } else {
            2
        }
    }
    /// Element counts of every parameter tensor.
    pub fn params(&self) -> Vec<u64> {
        // (room for a layer's tensors at once: grown from empty, the pushes reallocate
        // several times on every estimate)
        let mut v = Vec::with_capacity(32);
        self.attention.params(&mut v);
        self.mlp.params(&mut v);
        for _ in 0..self.norm_count() {
            self.norm().params(&mut v);
        }
        v
    }
    /// Element counts of the matmul weights that autocast's cast cache keeps: the weight
    /// matrices, and under `no_grad` the biases too (measured: with autograd on, the biases'
    /// 16-bit copies are not alive at the end of the forward). A mixture's grouped experts are
    /// not among them: `grouped_mm` is on no autocast list and transformers casts the rows to
    /// the experts' dtype instead, so only the router and the shared expert are cast.
    pub fn linear_params(&self, with_biases: bool) -> Vec<u64> {
        let mut v = Vec::with_capacity(32);
        if !with_biases {
            v.extend(self.attention.linears().iter().map(|l| l.n_in * l.n_out));
            self.mlp.weights(&mut v);
            return v;
        }
        for (_, l) in self.roled_linears() {
            v.push(l.n_in * l.n_out);
            if l.bias {
                v.push(l.n_out);
            }
        }
        v
    }
    /// Every linear of the layer with its role (a mixture's grouped experts are parameters,
    /// not linears: peft and bitsandbytes leave them).
    pub fn roled_linears(&self) -> Vec<(Role, Linear)> {
        let mut v = self.attention.roled_linears();
        match &self.mlp {
            FeedForward::Dense(m) => v.extend(m.roled_linears()),
            FeedForward::Moe(m) => v.extend(m.roled_linears()),
        }
        v
    }
    pub fn forward(&self, tape: &mut Tape, x: T, s: &StepShape) -> Res<T> {
        if s.seq_shards > 1 {
            return self.forward_sequence_parallel(tape, x, s);
        }
        let d = s.d;
        let hd = self.hidden_dropout;
        let norm = |tape: &mut Tape, x: T, part: SavedPart| -> Res<T> {
            tape.part = part;
            self.norm().forward(tape, x, d)
        };
        let mlp = |tape: &mut Tape, x: T| -> Res<T> {
            tape.part = SavedPart::Mlp;
            self.mlp.forward(tape, x, d)
        };
        let (pre, post) = (SavedPart::Norms, SavedPart::PostNorms);
        match self.placement {
            Placement::Pre | Placement::Sandwich => {
                let sandwich = self.placement == Placement::Sandwich;
                let n = norm(tape, x, pre)?;
                let mut a = self.attention.forward(tape, n, s)?;
                if sandwich {
                    a = norm(tape, a, post)?;
                }
                let a = dropout(tape, a, hd)?;
                let input = x;
                let x = residual(tape, x, a)?;
                if sandwich && !hd && tape.compiled && !s.compile.whole_model() {
                    // A block compiled on its own (measured with inductor on a Gemma 3 config:
                    // validation/COMPILE.md): the sum the pre-MLP norm reads is recomputed
                    // from the block's input (a graph input, kept by the first norm) and the
                    // post-attention norm's output, itself recomputed from that norm's kept
                    // input (o_proj's output) and statistics: neither the sum nor the norm's
                    // output is kept. The whole model's graph keeps the sum instead (as many
                    // bytes as the addend `residual` keeps in its place, measured too).
                    tape.recompute_sum_from(x, input);
                }
                let n = norm(tape, x, pre)?;
                let mut m = mlp(tape, n)?;
                if sandwich {
                    m = norm(tape, m, post)?;
                }
                let m = dropout(tape, m, hd)?;
                residual(tape, x, m)
            }
            Placement::Post => {
                let a = self.attention.forward(tape, x, s)?;
                let a = norm(tape, a, post)?;
                let x = residual(tape, x, a)?;
                let m = mlp(tape, x)?;
                let m = norm(tape, m, post)?;
                residual(tape, x, m)
            }
            Placement::PostResidual => {
                let a = self.attention.forward(tape, x, s)?;
                let a = dropout(tape, a, hd)?;
                let sum = residual(tape, x, a)?;
                let x = norm(tape, sum, pre)?;
                let m = mlp(tape, x)?;
                let m = dropout(tape, m, hd)?;
                let sum = residual(tape, x, m)?;
                norm(tape, sum, pre)
            }
        }
    }
}

impl Layer {
    /// A pre-norm (or sandwich) layer under sequence parallelism, as torchtitan's plan runs
    /// it: the norms, dropout and residual adds on this rank's slice of the tokens (`x` is
    /// that slice); each block reads the all-gathered normed tokens (a new tensor, which its
    /// column-parallel linears keep) and its row-parallel output is reduce-scattered back to
    /// a slice.
    fn forward_sequence_parallel(&self, tape: &mut Tape, x: T, s: &StepShape) -> Res<T> {
        let d = s.d;
        let hd = self.hidden_dropout;
        let h = self.attention.hidden;
        let full = tape.tokens;
        let slice = s.stream_tokens(full);
        let sandwich = self.placement == Placement::Sandwich;
        let norm = |tape: &mut Tape, x: T, part: SavedPart| -> Res<T> {
            tape.part = part;
            self.norm().forward(tape, x, d)
        };
        let mut x = x;
        for block in 0..2 {
            tape.tokens = slice;
            let n = norm(tape, x, SavedPart::Norms)?;
            tape.tokens = full;
            let gathered = tape.tensor(h, n.bytes)?;
            let out = if block == 0 {
                self.attention.forward(tape, gathered, s)?
            } else {
                tape.part = SavedPart::Mlp;
                self.mlp.forward(tape, gathered, d)?
            };
            tape.tokens = slice;
            let mut out = tape.tensor(h, out.bytes)?;
            if sandwich {
                out = norm(tape, out, SavedPart::PostNorms)?;
            }
            let out = dropout(tape, out, hd)?;
            x = residual(tape, x, out)?;
        }
        tape.tokens = full;
        Ok(x)
    }
}

/// How the token embeddings are scaled before the first layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum EmbedScale {
    None,
    /// Multiplied by a 0-dim tensor (Gemma's `normalizer`), which the product keeps.
    Tensor,
    /// Multiplied by a Python float (Granite's `embedding_multiplier`).
    Scalar,
}

/// The input side of a text model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Embedding {
    pub vocab: u64,
    pub hidden: u64,
    /// Learned position rows (GPT-2, BERT, RoBERTa with its offset), 0 for none.
    pub positions: u64,
    /// Token-type rows (BERT), 0 for none.
    pub token_types: u64,
    /// Index tensors of `batch x seq` int64 built per forward and kept by the embedding
    /// lookups (RoBERTa's position ids and gathered token-type ids).
    pub index_tensors: u64,
    /// A LayerNorm after the sum (BERT, RoBERTa).
    pub norm: bool,
    pub dropout: bool,
    pub scale: EmbedScale,
    /// Width of the token embeddings when it differs from the layers' (OPT's
    /// `word_embed_proj_dim`): `project_in` widens them to the layers' width and
    /// `project_out` narrows the last hidden state back for the (tied) head; 0 for none.
    pub proj: u64,
}

/// ViT's patch embedding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Vision {
    pub image: u64,
    pub patch: u64,
}

impl Vision {
    /// Patches plus the class token.
    pub fn tokens(&self) -> u64 {
        let side = self.image.checked_div(self.patch).unwrap_or(0);
        side * side + 1
    }
}

/// The output side: the head and its loss.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Head {
    /// Next-token prediction: `lm_head`, optional soft-capping (Gemma 2) or division of the
    /// logits (Granite), cross-entropy on fp32 logits with shifted labels.
    CausalLm {
        softcap: bool,
        scaled: bool,
        /// Whether torch.compile of the whole model traces the loss in the head's graph:
        /// transformers resolves `loss_function` from a class name ending in `ForCausalLM`;
        /// `GPT2LMHeadModel`'s logs a warning there, which breaks the graph before the loss.
        loss_in_graph: bool,
    },
    /// BERT/RoBERTa masked-LM head: dense, GELU, LayerNorm, decoder with bias, every token
    /// labelled.
    MaskedLm,
    /// ViT: LayerNorm and a linear classifier on the class token.
    ImageClassifier,
}

/// A whole model.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct ModelSpec {
    pub embedding: Embedding,
    pub vision: Option<Vision>,
    pub layers: Vec<Layer>,
    pub final_norm: Option<NormKind>,
    pub head: Head,
    pub tied: bool,
    /// Width of the rotary tables (cos, sin) the model computes per forward, 0 for none.
    pub rotary_width: u64,
    /// One pair of tables per attention type that its layers use (Gemma 3: local and
    /// global), else one pair.
    pub rotary_per_attention_type: bool,
    /// The tables stay in fp32 whatever the model's dtype (OLMo 2).
    pub rotary_fp32: bool,
    /// Element counts of the module buffers (rotary `inv_freq`, BERT's id buffers).
    pub buffers: Vec<(u64, u64)>,
    /// Whether this part of the model has the embeddings (false for a pipeline stage after
    /// the first: its input arrives from the previous stage).
    pub embeds: bool,
    /// Whether it has the final norm, the head and the loss (false for a pipeline stage
    /// before the last: its output is sent on).
    pub heads: bool,
}

/// What a forward pass keeps, and the transients around it.
pub(crate) struct ForwardTape {
    /// Saved by one layer of each group of [`ModelSpec::layer_groups`] (without autocast's
    /// weight copies), in the same order.
    pub per_group: Vec<u64>,
    /// Every tensor one layer of each group makes (its input first), with whether backward
    /// keeps it, in the order they are made.
    pub per_group_log: Vec<Vec<(u64, bool)>>,
    /// Saved outside the layers: embeddings, rotary tables, masks, final norm, head, loss.
    pub outside: u64,
    /// The part of `outside` saved by the final norm, head and loss (freed before the last
    /// layer's backward).
    pub head_saved: u64,
    /// Gradient buffers of the loss at the start of backward.
    pub loss_buffers: u64,
    /// Extra forward transient at the loss (logits and their fp32 copy).
    pub loss_forward: u64,
    /// The loss's tensors for the allocator's replay (their saved part is in `head_saved`).
    pub loss_tensors: LossTensors,
    /// Extra transient after the model's forward returned (outside autocast).
    pub after_forward: u64,
    /// Largest set of live tensors in a no-grad forward at the head (with autocast's copy of
    /// the head weight there), beyond weights and input.
    pub inference: u64,
    /// Largest set of live tensors inside the layers' MLPs in a no-grad forward (before the
    /// head's weight copy exists).
    pub inference_layers: u64,
    /// Largest set of live tensors inside eager attention in a no-grad forward (the last
    /// layer's output projection and MLP not cast yet).
    pub inference_attention: u64,
    /// Whether autocast's 16-bit copy of the head weight is kept for backward.
    pub keeps_head_cast: bool,
    /// What the layers' saved bytes are for, summed over the layers.
    pub layer_parts: PartBytes,
    /// What the saved bytes outside the layers are for.
    pub outside_parts: PartBytes,
    /// What the last layer saves, by part (its MLP's share is freed first in backward).
    pub last_layer_parts: PartBytes,
    /// What the first layer saves, by part (before any frozen-base discount).
    pub first_layer_parts: PartBytes,
    /// What the first layer does not keep because its input needs no gradient (a frozen
    /// base without checkpointing), already taken out of `layer_parts`.
    pub first_layer_discount: u64,
}

/// How many different values `values` holds (the attention types' masks: full, one per
/// sliding window). A linear search over the few kept, rather than a sort (smaller in
/// WebAssembly).
fn distinct(values: impl Iterator<Item = Option<u64>>) -> u64 {
    let mut seen: Vec<Option<u64>> = Vec::new();
    for v in values {
        if !seen.contains(&v) {
            seen.push(v);
        }
    }
    seen.len() as u64
}

impl ModelSpec {
    /// This model with every dropout at p = 0 (TRL's `disable_dropout_in_model`), or
    /// `None` when none runs in training: a dropout of p = 0 returns its input (ATen
    /// `_dropout`) and keeps no mask.
    pub(crate) fn without_dropout(&self) -> Option<Self> {
        let any = self.embedding.dropout
            || self
                .layers
                .iter()
                .any(|l| l.hidden_dropout || l.attention.probs_dropout);
        any.then(|| {
            let mut spec = self.clone();
            spec.embedding.dropout = false;
            for l in &mut spec.layers {
                l.hidden_dropout = false;
                l.attention.probs_dropout = false;
            }
            spec
        })
    }

    pub fn hidden(&self) -> u64 {
        self.embedding.hidden
    }
    fn vocab(&self) -> u64 {
        self.embedding.vocab
    }
    /// Width of the token embeddings and of the head's input (the layers' width unless the
    /// model projects in and out).
    pub fn token_width(&self) -> u64 {
        if self.embedding.proj > 0 {
            self.embedding.proj
        } else {
            self.hidden()
        }
    }
    /// The distinct layers, each with how many times it occurs, in order of first occurrence,
    /// and each layer's group (an index into them), found in one pass: comparing whole layers
    /// is a good part of an estimate.
    pub fn layer_groups(&self) -> (Vec<(&Layer, u64)>, Vec<usize>) {
        let mut groups: Vec<(&Layer, u64)> = Vec::with_capacity(4);
        let mut group_of = Vec::with_capacity(self.layers.len());
        for layer in &self.layers {
            match groups.iter_mut().position(|(l, _)| *l == layer) {
                Some(g) => {
                    if let Some((_, n)) = groups.get_mut(g) {
                        *n += 1;
                    }
                    group_of.push(g);
                }
                None => {
                    group_of.push(groups.len());
                    groups.push((layer, 1));
                }
            }
        }
        (groups, group_of)
    }
    /// Element counts of the parameter tensors outside the layers.
    pub fn outside_parameter_tensors(&self) -> Vec<u64> {
        self.outside_params(true)
    }
    /// Bytes of eager attention's float masks: one per attention type (full, sliding), 0
    /// when no layer runs eager.
    /// transformers' bool masks (batch, 1, seq, seq) for SDPA, one per attention type that
    /// takes a mask (a sliding window the sequence reaches, or every type for padded or
    /// packed rows): checkpointing keeps them as layer arguments until backward.
    ///
    /// Both read the distinct layers, `groups` ([`Self::layer_groups`]): equal layers have
    /// equal masks, and each estimate would otherwise walk every layer for them.
    // (kept a function of its own: inlined into its one caller, the page's bundle gzipped
    // as one file 550 B larger, measured, though its sections gzipped apart barely moved)
    #[inline(never)]
    pub fn sdpa_masks(groups: &[(&Layer, u64)], s: &StepShape) -> Res<u64> {
        let windows = distinct(
            groups
                .iter()
                .filter(|(l, _)| l.attention.kernel(s) != Kernel::Eager && l.attention.masked(s))
                .map(|(l, _)| l.attention.window),
        );
        mul(storage(mul(s.batch, mul(s.seq, s.seq)?)?, 1)?, windows)
    }
    pub fn eager_masks(groups: &[(&Layer, u64)], s: &StepShape) -> Res<u64> {
        if !groups
            .iter()
            .any(|(l, _)| l.attention.kernel(s) == Kernel::Eager)
        {
            return Ok(0);
        }
        let windows = distinct(groups.iter().map(|(l, _)| l.attention.window));
        mul(Attention::eager_mask(s)?, windows)
    }
    /// Element counts of the embeddings' parameter tensors (a tied head matrix among them).
    pub fn embedding_parameter_tensors(&self) -> Vec<u64> {
        let mut t = self.outside_params(true);
        if self.heads {
            t.truncate(t.len().saturating_sub(self.head_params().len()));
        }
        t
    }
    /// Element counts of every parameter tensor (tied weights once).
    pub fn parameter_tensors(&self) -> Vec<u64> {
        let mut t = self.outside_params(true);
        for l in &self.layers {
            t.extend(l.params());
        }
        t
    }
    /// Parameters outside the layers; `with_tied_head` adds a separate head matrix.
    fn outside_params(&self, with_embeddings: bool) -> Vec<u64> {
        let (h, v) = (self.hidden(), self.vocab());
        let e = &self.embedding;
        let mut t = Vec::with_capacity(16);
        if with_embeddings && self.embeds {
            if let Some(vis) = self.vision {
                let p = vis.patch;
                t.extend([h * 3 * p * p, h, h, vis.tokens() * h]);
            } else if e.proj > 0 {
                // embed_tokens, embed_positions, project_out, project_in (PyTorch's order)
                t.push(v * e.proj);
                t.extend([e.positions * h, h * e.proj, e.proj * h]);
            } else {
                t.push(v * h);
                if e.positions > 0 {
                    t.push(e.positions * h);
                }
                if e.token_types > 0 {
                    t.push(e.token_types * h);
                }
                if e.norm {
                    t.extend([h, h]);
                }
            }
        }
        if self.heads {
            t.extend(self.head_params());
        }
        t
    }
    /// The final norm and the head (with the tied matrix when tied: its gradient is there).
    fn head_params(&self) -> Vec<u64> {
        let (h, v) = (self.hidden(), self.vocab());
        let mut t = Vec::new();
        if let Some(n) = self.final_norm {
            Norm::new(n, h).params(&mut t);
        }
        match self.head {
            Head::CausalLm { .. } => {
                // a last pipeline stage holds its own copy of a tied matrix
                if !self.tied || !self.embeds {
                    t.push(v * self.token_width());
                }
            }
            Head::MaskedLm => t.extend([h * h, h, h, h, v]),
            Head::ImageClassifier => t.extend([v * h, v]),
        }
        t
    }
    /// Matmul weights outside the layers that autocast's cast cache keeps (see
    /// [`Layer::linear_params`] for the biases).
    pub fn head_linears(&self, with_biases: bool) -> Vec<u64> {
        let (h, v) = (self.hidden(), self.vocab());
        if !self.heads {
            return Vec::new();
        }
        match self.head {
            Head::MaskedLm if with_biases => vec![h * h, h, v * h, v],
            Head::MaskedLm => vec![h * h, v * h],
            Head::ImageClassifier => {
                let p = self.vision.map_or(0, |vis| vis.patch);
                vec![v * h, v, h * 3 * p * p, h]
            }
            // with project_in / project_out, their weights are cast too
            Head::CausalLm { .. } if self.embedding.proj > 0 => {
                let p = self.embedding.proj;
                vec![v * p, h * p, p * h]
            }
            Head::CausalLm { .. } => vec![v * h],
        }
    }
    /// Elements of a tied matrix's head share among [`Self::head_gradient_tensors`]: a causal
    /// LM's head tied to its embeddings (one parameter, two uses).
    pub fn tied_head_matrix(&self) -> Option<u64> {
        (self.tied && self.embeds && self.heads && matches!(self.head, Head::CausalLm { .. }))
            .then(|| self.vocab() * self.token_width())
    }
    /// Parameters whose gradients exist once backward reaches the last layer: the head's
    /// ([`Self::head_parameter_tensors`]) and the last layer's output matmul.
    pub fn head_gradient_tensors(&self) -> Vec<u64> {
        let mut t = self.head_parameter_tensors();
        if let Some(last) = self.layers.last() {
            last.mlp.down_params(&mut t);
        }
        t
    }
    /// The head's parameters (and a tied embedding's share), the final norm's: the
    /// gradients the head's backward makes (the last layer's are its own).
    pub fn head_parameter_tensors(&self) -> Vec<u64> {
        let (h, v) = (self.hidden(), self.vocab());
        let mut t = if self.heads {
            self.head_params()
        } else {
            Vec::new()
        };
        t.extend(self.tied_head_matrix());
        if self.head == Head::MaskedLm {
            t.push(v * h); // the tied decoder
        }
        t
    }

    /// Runs the forward of one step on a tape.
    /// `groups`: [`Self::layer_groups`].
    pub fn forward(&self, s: &StepShape, groups: &[(&Layer, u64)]) -> Res<ForwardTape> {
        let d = s.d;
        let (w, r) = (d.act, d.resid());
        // the logits' width: the whole vocabulary unless loss parallelism keeps a slice
        let (h, v) = (self.hidden(), s.loss_vocab);
        let tokens = mul(s.batch, s.seq)?;
        let tv = mul(tokens, v)?;
        let mut tape = Tape::new(tokens);
        tape.peft = s.peft;
        // the embeddings and the final norm are compiled with the whole model; per block,
        // they stay eager
        tape.compiled = s.compile.whole_model();
        if self.embeds {
            self.embed(&mut tape, s)?;
        }
        // compiled whole, the model recomputes its rotary tables from `inv_freq` in backward
        // (measured on Llama: nothing of them is kept); compiled per block they are the
        // blocks' inputs, kept as in eager
        let rotary_pairs = if s.compile.whole_model() || s.unsloth {
            0
        } else {
            self.rotary_pairs()
        };
        for _ in 0..rotary_pairs {
            let bytes = if self.rotary_fp32 { 4 } else { r };
            // cos and sin are computed for positions (1, seq), shared by the batch
            let elems = mul(s.seq, self.rotary_width)?;
            tape.raw(elems, bytes).and_then(|t| tape.save(t))?; // cos
            tape.raw(elems, bytes).and_then(|t| tape.save(t))?; // sin
        }
        // compiled whole, one additive mask per attention type (window) that takes a mask,
        // kept for all its layers ([`Attention::shares_masks`])
        if Attention::shares_masks(s) {
            let shared = distinct(
                groups
                    .iter()
                    .filter(|(l, _)| {
                        l.attention.kernel(s) == Kernel::Efficient && l.attention.masked(s)
                    })
                    .map(|(l, _)| l.attention.window),
            );
            let part = std::mem::replace(&mut tape.part, SavedPart::Masks);
            for _ in 0..shared {
                tape.raw(Attention::additive_mask(s)?, d.act)
                    .and_then(|t| tape.save(t))?;
            }
            tape.part = part;
        }
        // Each distinct layer runs once on a tape of its own from a fresh input (what it saves
        // of its input counts in it, as it would in one long tape).
        let mut per_group = Vec::new();
        let mut per_group_log = Vec::new();
        let mut layer_parts = PartBytes::default();
        let mut last_layer_parts = PartBytes::default();
        // the first layer's group comes first (groups are in order of first occurrence)
        let mut first_layer: Option<(u64, PartBytes)> = None;
        let last = self.layers.last();
        let run = |layer: &Layer, grad: bool| -> Res<Tape> {
            let mut own = Tape::new(tokens);
            own.peft = s.peft;
            own.compiled = s.compile.blocks();
            let input = own.raw(mul(s.stream_tokens(tokens), h)?, r)?;
            own.grad = grad;
            layer.forward(&mut own, input, s)?;
            Ok(own)
        };
        for &(layer, count) in groups {
            let own = run(layer, true)?;
            per_group.push(own.total());
            per_group_log.push(own.log());
            first_layer.get_or_insert((own.total(), own.parts));
            if last == Some(layer) {
                last_layer_parts = own.parts;
            }
            for part in SavedPart::ALL {
                layer_parts.add(part, mul(own.parts.get(part), count)?)?;
            }
        }
        // With a frozen base and no input gradients, the first layer records nothing for
        // backward until its first adapter runs.
        let mut first_layer_discount = 0;
        if let (Some(first), Some((full_total, full_parts)), Some(p)) =
            (self.layers.first(), first_layer, s.peft)
        {
            if !p.input_grad {
                let own = run(first, false)?;
                first_layer_discount = full_total.saturating_sub(own.total());
                layer_parts.remove(&full_parts);
                layer_parts.merge(&own.parts)?;
            }
        }
        // the head reads the last layer's output, a fresh tensor to the head's tape
        let x = tape.tensor(h, r)?;
        let head_start = tape.total();
        tape.part = SavedPart::HeadAndLoss;
        let hidden_r = storage(tokens, mul(h, r)?)?;
        let mut keeps_head_cast = true;
        let mut after_forward = 0;
        let mut loss_tensors = None;
        let (loss_buffers, loss_forward, (inference, inference_layers, inference_attention)) =
            match self.head {
                // a pipeline stage before the last sends its output on
                _ if !self.heads => {
                    keeps_head_cast = false;
                    (0, 0, (0, 0, 0))
                }
                Head::CausalLm {
                    softcap,
                    scaled,
                    loss_in_graph,
                } => {
                    let x = match self.final_norm {
                        Some(n) if s.seq_shards > 1 => {
                            // the final norm on this rank's slice, its output gathered for
                            // the column-parallel head
                            tape.tokens = s.stream_tokens(tokens);
                            let x = tape.tensor(h, r)?;
                            let x = Norm::new(n, h).forward(&mut tape, x, d)?;
                            tape.tokens = tokens;
                            tape.tensor(h, x.bytes)?
                        }
                        Some(n) if s.unsloth => {
                            Norm::new(n, h).forward_compiled(&mut tape, x, d)?
                        }
                        Some(n) => Norm::new(n, h).forward(&mut tape, x, d)?,
                        None => x,
                    };
                    let x = if self.embedding.proj > 0 {
                        Linear::new(h, self.embedding.proj, false).forward(&mut tape, x, d)?
                    } else {
                        x
                    };
                    let head = CausalHead {
                        hidden: self.token_width(),
                        vocab: s.loss_vocab,
                        softcap,
                        loss_in_graph,
                        weight_grad_bytes: s.head_grad_bytes,
                        weight_bytes: s.head_weight_bytes,
                    };
                    let costs = head.loss(s.loss, &mut tape, x, s)?;
                    keeps_head_cast = costs.keeps_head_cast;
                    after_forward = costs.after_forward;
                    loss_tensors = costs.tensors;
                    let logits_w = storage(tv, w)?;
                    let inner = storage(tokens, mul(self.max_inner(), w)?)?;
                    let k = self
                        .layers
                        .last()
                        .map_or(3, |l| l.mlp.inference_inner_tensors());
                    let mlp_live = add(mul(hidden_r, 2)?, mul(inner, k)?)?;
                    // grouped experts (GLU) in their weights' dtype (fp32 under autocast): the
                    // gathered rows, the fused gate/up output, the activation and the product,
                    // next to the embeddings' output, the layer's input, its middle residual and
                    // the normed input (checked with validation/peak_live.py on Mixtral)
                    let moe_live = groups.iter().try_fold(0, |acc, (l, _)| {
                        let FeedForward::Moe(m) = l.mlp else {
                            return Ok(acc);
                        };
                        if m.act != ExpertAct::Glu {
                            return Ok(acc);
                        }
                        let (rows, wd) = (mul(tokens, m.top_k)?, d.weight);
                        let experts = add(
                            add(
                                storage(rows, mul(m.hidden, wd)?)?,
                                storage(rows, mul(2 * m.inner, wd)?)?,
                            )?,
                            mul(storage(rows, mul(m.inner, wd)?)?, 2)?,
                        )?;
                        Ok::<u64, TooLarge>(acc.max(add(mul(hidden_r, 4)?, experts)?))
                    })?;
                    let mlp_live = mlp_live.max(moe_live);
                    // the final norm's output (and its 16-bit cast for a LayerNorm under
                    // autocast) next to the logits
                    let head_live = if self.embedding.proj > 0 {
                        // project_out's output replaces the final norm's
                        add(logits_w, storage(tokens, mul(self.token_width(), w)?)?)?
                    } else if self.final_norm == Some(NormKind::LayerNorm) {
                        add(
                            add(logits_w, hidden_r)?,
                            if d.amp {
                                storage(tokens, mul(h, 2)?)?
                            } else {
                                0
                            },
                        )?
                    } else {
                        add(logits_w, storage(tokens, mul(h, w)?)?)?
                    };
                    // soft-capping or scaling the logits makes a second logits-sized tensor
                    // while the first is alive
                    let head_live = if softcap || scaled {
                        add(head_live, logits_w)?
                    } else {
                        head_live
                    };
                    // with a sliding-window mask, HF's bool mask lives through the forward and each
                    // layer converts it to the query's dtype
                    let masks = if groups.iter().any(|(l, _)| l.attention.masked(s)) {
                        let area = mul(s.seq, s.seq)?;
                        // a padded or packed batch's bool mask is per sample; a sliding window's
                        // is broadcast over the batch
                        let rows = if s.mask { s.batch } else { 1 };
                        add(
                            storage(mul(rows, area)?, 1)?,
                            storage(mul(s.batch, area)?, w)?,
                        )?
                    } else {
                        0
                    };
                    // eager attention gets a float mask per attention type (full, sliding)
                    // instead, alive through the layers (freed when the model's forward returns,
                    // before the head)
                    let eager = groups
                        .iter()
                        .any(|(l, _)| l.attention.kernel(s) == Kernel::Eager);
                    let head_masks = if eager { 0 } else { masks };
                    let masks = if eager {
                        Self::eager_masks(groups, s)?
                    } else {
                        masks
                    };
                    // inside eager attention: the embeddings' output and the learned positions'
                    // (still referenced by the model's forward), the layer's input and, before
                    // a pre-norm attention, its normed copy, with the attention's own tensors
                    let attn_live = groups.iter().try_fold(0, |acc, (l, _)| {
                        let own = l.attention.inference_live(s)?;
                        if own == 0 {
                            return Ok::<u64, TooLarge>(acc);
                        }
                        let hiddens = 2
                            + u64::from(self.embedding.positions > 0)
                            + u64::from(matches!(
                                l.placement,
                                Placement::Pre | Placement::Sandwich
                            ));
                        Ok(acc.max(add(add(mul(hidden_r, hiddens)?, own)?, masks)?))
                    })?;
                    let head_live = add(head_live, head_masks)?;
                    let mlp_live = add(mlp_live, masks)?;
                    let mlp_live = if self.final_norm == Some(NormKind::LayerNorm) {
                        0
                    } else {
                        mlp_live
                    };
                    (
                        costs.backward,
                        costs.forward,
                        (head_live, mlp_live, attn_live),
                    )
                }
                Head::MaskedLm => {
                    let y = Linear::new(h, h, true).forward(&mut tape, x, d)?;
                    let y = Activation::Kernel.forward(&mut tape, y, d)?;
                    let y = Norm::new(NormKind::LayerNorm, h).forward(&mut tape, y, d)?;
                    Linear::new(h, v, true).run(Role::Head, &mut tape, y, d)?;
                    // cross_entropy: log_softmax (fp32 under autocast) kept; under autocast the
                    // 16-bit logits stay referenced by the graph too
                    tape.raw(tv, if d.amp { 4 } else { w })
                        .and_then(|t| tape.save(t))?;
                    if d.amp {
                        tape.raw(tv, 2).and_then(|t| tape.save(t))?;
                    }
                    let buffers = if d.amp {
                        storage(tv, 4)?
                    } else {
                        mul(storage(tv, w)?, 2)?
                    };
                    let live = add(
                        add(storage(tv, w)?, mul(hidden_r, 2)?)?,
                        if d.amp {
                            storage(tokens, mul(h, 2)?)?
                        } else {
                            0
                        },
                    )?;
                    (buffers, storage(tv, w)?, (live, 0, 0))
                }
                Head::ImageClassifier => {
                    let b = s.batch;
                    // the final LayerNorm runs over every token; the classifier reads the class token
                    tape.save(x)?;
                    tape.saved(1, 4)?;
                    tape.saved(1, 4)?;
                    if d.amp {
                        tape.raw(mul(b, h)?, 2).and_then(|t| tape.save(t))?;
                        tape.raw(mul(b, v)?, 2).and_then(|t| tape.save(t))?;
                    } else {
                        tape.saved(h, w)?;
                    }
                    tape.raw(mul(b, v)?, if w == 2 && !d.amp { 2 } else { 4 })
                        .and_then(|t| tape.save(t))?;
                    let inner = storage(tokens, mul(self.max_inner(), w)?)?;
                    let live = add(mul(hidden_r, 5)?, mul(inner, 2)?)?;
                    (storage(mul(b, v)?, 4)?, 0, (live, 0, 0))
                }
            };
        let total = tape.total();
        Ok(ForwardTape {
            last_layer_parts,
            first_layer_parts: first_layer.map(|(_, p)| p).unwrap_or_default(),
            layer_parts,
            outside_parts: tape.parts,
            per_group,
            per_group_log,
            outside: total,
            head_saved: total - head_start,
            loss_buffers,
            loss_forward,
            loss_tensors: loss_tensors
                .unwrap_or_else(|| LossTensors::blocks(loss_forward, loss_buffers)),
            after_forward,
            inference,
            inference_layers,
            inference_attention,
            keeps_head_cast,
            first_layer_discount,
        })
    }

    /// Pairs of rotary tables a forward computes.
    fn rotary_pairs(&self) -> usize {
        let roped = self
            .layers
            .iter()
            .filter(|l| l.attention.rotary_dim.is_some());
        if self.rotary_per_attention_type {
            let (mut local, mut global) = (false, false);
            for l in roped {
                if l.attention.window.is_some() {
                    local = true;
                } else {
                    global = true;
                }
            }
            usize::from(local) + usize::from(global)
        } else {
            usize::from(roped.count() > 0)
        }
    }

    fn max_inner(&self) -> u64 {
        self.layers
            .iter()
            .map(|l| l.mlp.inner_per_token())
            .max()
            .unwrap_or(0)
    }

    /// The embeddings' forward: returns the residual stream entering the first layer.
    fn embed(&self, tape: &mut Tape, s: &StepShape) -> Res<T> {
        let d = s.d;
        let r = d.resid();
        let h = self.hidden();
        if let Some(vis) = self.vision {
            if d.amp {
                // the conv stem keeps its 16-bit cast of the image until the end of backward
                let px = mul(mul(s.batch, 3)?, mul(vis.image, vis.image)?)?;
                tape.raw(px, 2).and_then(|t| tape.save(t))?;
            }
            return tape.tensor(h, r);
        }
        let e = &self.embedding;
        for _ in 0..e.index_tensors {
            tape.saved(1, 8)?;
        }
        let mut x = if e.proj > 0 {
            // project_in reads the token embeddings; the positions are added to its output
            let tokens = tape.tensor(e.proj, r)?;
            let x = Linear::new(e.proj, h, false).forward(tape, tokens, d)?;
            tape.like(x, x.bytes.max(r))?
        } else {
            tape.tensor(h, r)?
        };
        match e.scale {
            EmbedScale::Tensor => {
                tape.raw(1, r).and_then(|t| tape.save(t))?; // the 0-dim normalizer
                x = tape.like(x, r)?;
            }
            EmbedScale::Scalar => x = tape.like(x, r)?,
            EmbedScale::None => {}
        }
        if e.norm {
            x = Norm::new(NormKind::LayerNorm, h).forward(tape, x, d)?;
        }
        dropout(tape, x, e.dropout)
    }
}
