//! The head and its cross-entropy as each trainer runs them: what they save for backward and
//! what lives for a moment around them. The trainers agree on the loss's value and differ in
//! what they keep of the vocabulary-sized logits, which is most of the step's memory for a
//! small model with a large vocabulary (Qwen3-0.6B: 151,936 entries for a hidden size of 1024).
//!
//! Each rule is read off the pinned source (`validation/LOSSES.md`) and, where the loss runs
//! on the CPU, checked against the harness (`validation/trainers.py`,
//! `tests/fixtures/trainers-measured.jsonl`).

use super::model::StepShape;
use super::ops::{add, mul, storage, Linear, Res, SavedPart, Tape, T};
use super::peft::Role;
use super::recipe::LossKind;

/// TRL's `_CHUNKED_LM_HEAD_CHUNK_SIZE`: valid tokens per chunk of `chunked_nll`.
pub(crate) const TRL_CHUNK_TOKENS: u64 = 256;
/// torchtune's `num_output_chunks` in its recipes.
pub(crate) const TORCHTUNE_CHUNKS: u64 = 8;
/// TRL's `entropy_from_logits` default: rows per chunk of its no-gradient entropy.
const TRL_ENTROPY_ROWS: u64 = 128;
/// TRL's `ChunkedLogProbFunction` tiles (`trl/kernels/chunked_logprob.py`).
const TRL_FUSED_TOKENS: u64 = 4096;
const TRL_FUSED_VOCAB: u64 = 32_768;

/// The causal-LM head as the loss sees it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CausalHead {
    pub hidden: u64,
    pub vocab: u64,
    /// Gemma 2's `tanh` soft-capping of the logits.
    pub softcap: bool,
    /// Bytes per element of the head weight's gradient (0 when it is frozen).
    pub weight_grad_bytes: u64,
}

/// What the loss adds to the step beyond the tensors it saved on the tape.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct LossCosts {
    /// Alive for a moment at the forward's loss, beyond the saved tensors.
    pub forward: u64,
    /// Alive at the start of backward, beyond the saved tensors: the loss's gradient buffers,
    /// or the chunked losses' recomputed chunk with its gradients.
    pub backward: u64,
    /// Whether autocast's 16-bit copy of the head weight is saved for backward (the head runs
    /// as `lm_head` once); the chunked losses cast it again per chunk instead.
    pub keeps_head_cast: bool,
}

impl CausalHead {
    /// Runs the head and the loss of `kind` on `tape` from the final norm's output `x`.
    pub(crate) fn loss(
        &self,
        kind: LossKind,
        tape: &mut Tape,
        x: T,
        s: &StepShape,
    ) -> Res<LossCosts> {
        match kind {
            LossKind::Hf | LossKind::TrlNll => self.full_logits(kind, tape, x, s),
            LossKind::TrlChunked => self.trl_chunked(tape, x, s),
            LossKind::TorchtuneChunked => self.torchtune_chunked(tape, x, s),
            LossKind::Liger => self.liger(tape, x, s),
            LossKind::Cce => self.cce(tape, x, s),
            LossKind::TrlFused => self.trl_fused(tape, x, s),
        }
    }

    /// `lm_head` over every token, the logits upcast to fp32, `cross_entropy` with shifted
    /// labels (transformers' `ForCausalLMLoss`); TRL's `nll` adds its metrics on the logits.
    fn full_logits(&self, kind: LossKind, tape: &mut Tape, x: T, s: &StepShape) -> Res<LossCosts> {
        let d = s.d;
        let w = d.act;
        let (h, v) = (self.hidden, self.vocab);
        let tokens = tape.tokens;
        let tv = mul(tokens, v)?;
        let logits = Linear::new(h, v, false).run(Role::Head, tape, x, d)?;
        if self.softcap {
            tape.part = SavedPart::SoftCapping;
            let t = tape.like(logits, w)?; // tanh(logits / cap)
            tape.save(t)?;
            tape.part = SavedPart::HeadAndLoss;
        }
        tape.raw(tv, 4).and_then(|t| tape.save(t))?; // log_softmax of fp32 logits
        tape.saved(1, 8)?; // shifted labels
        let logits_w = storage(tv, w)?;
        let logits_32 = storage(tv, 4)?;
        let at_loss = add(logits_w, if w == 4 { 0 } else { logits_32 })?;
        let forward = if kind == LossKind::TrlNll {
            // SFTTrainer's metrics under no_grad, the model's logits still held by its output:
            // `entropy_from_logits` flattens the shifted logits (a copy when the batch has
            // more than one row) and runs log_softmax, exp and their product per 128 rows
            let shifted = mul(mul(s.batch, s.seq.saturating_sub(1))?, v)?;
            let copy = if s.batch > 1 { storage(shifted, w)? } else { 0 };
            let rows = mul(mul(TRL_ENTROPY_ROWS, v)?, w)?;
            let metrics = add(add(logits_w, copy)?, mul(storage(rows, 1)?, 3)?)?;
            at_loss.max(metrics)
        } else {
            at_loss
        };
        Ok(LossCosts {
            forward,
            backward: mul(logits_32, 2)?,
            keeps_head_cast: true,
        })
    }

    /// TRL's `chunked_nll` (`sft_trainer._chunked_cross_entropy_loss`, v1.7 to v1.13): the
    /// shifted hidden states gathered valid tokens first, then `lm_head` and the loss per
    /// 256 tokens under non-reentrant checkpointing: only the gathered hidden states, the
    /// sort order and the labels outlive the forward.
    fn trl_chunked(&self, tape: &mut Tape, x: T, s: &StepShape) -> Res<LossCosts> {
        let (h, v) = (self.hidden, self.vocab);
        let shifted = mul(s.batch, s.seq.saturating_sub(1))?;
        let r = x.bytes;
        // `hidden[..., :-1, :].reshape(-1, H)` copies a batch of more than one row; the
        // gather by the sort order copies again and outlives it (the chunks are its views)
        let flat = if s.batch > 1 {
            storage(mul(shifted, h)?, r)?
        } else {
            0
        };
        let gathered = tape.raw(mul(shifted, h)?, r)?;
        tape.save(gathered)?;
        tape.raw(shifted, 8).and_then(|t| tape.save(t))?; // the sort order (index backward)
        tape.raw(shifted, 8).and_then(|t| tape.save(t))?; // the gathered labels
        let chunk = TRL_CHUNK_TOKENS.min(shifted.max(1));
        let cv4 = storage(mul(chunk, v)?, 4)?;
        // soft-capping makes one more fp32 chunk (TRL does not read Granite's
        // `logits_scaling`, so that model's chunks are not scaled)
        let chunk_tensors = if self.softcap { 5 } else { 4 };
        // under autocast each chunk casts the head weight to 16 bits
        let weight_cast = if s.d.amp { storage(mul(v, h)?, 2)? } else { 0 };
        // one chunk's forward: fp32 logits, log_softmax, and the entropy's exp and product;
        // the final norm's output and the flattened copy are still referenced
        let forward = add(
            add(mul(cv4, chunk_tensors)?, weight_cast)?,
            add(storage(mul(tokens_of(s)?, h)?, r)?, flat)?,
        )?;
        // backward, one chunk at a time: the recomputed log_softmax and exp, the gradients of
        // log_p and of the logits (fp32), the head weight's gradient and the hidden states'
        // gradient (the chunk's slice scattered into a full-size buffer, added to the sum)
        let grads = add(
            storage(mul(v, h)?, self.weight_grad_bytes)?,
            mul(storage(mul(shifted, h)?, r)?, 2)?,
        )?;
        let backward = add(add(mul(cv4, chunk_tensors)?, weight_cast)?, grads)?;
        Ok(LossCosts {
            forward,
            backward,
            keeps_head_cast: false,
        })
    }

    /// torchtune's `CEWithChunkedOutputLoss`: the decoder returns its logits in 8 chunks
    /// along the sequence, in the model's dtype; each is upcast to fp32 and goes through
    /// `cross_entropy`, whose log_softmax is kept per chunk.
    fn torchtune_chunked(&self, tape: &mut Tape, x: T, s: &StepShape) -> Res<LossCosts> {
        let d = s.d;
        let w = d.act;
        let (h, v) = (self.hidden, self.vocab);
        let tokens = tape.tokens;
        Linear::new(h, v, false).run(Role::Head, tape, x, d)?;
        let chunks = TORCHTUNE_CHUNKS.min(s.seq.max(1));
        let per_chunk = mul(mul(s.batch, s.seq.div_ceil(chunks))?, v)?;
        let mut chunk_bytes = 0;
        for _ in 0..chunks {
            let t = tape.raw(per_chunk, 4)?; // log_softmax of this chunk
            tape.save(t)?;
            chunk_bytes = storage(per_chunk, 4)?;
        }
        tape.saved(1, 8)?; // labels
        let logits_w = storage(mul(tokens, v)?, w)?;
        Ok(LossCosts {
            forward: add(logits_w, if w == 4 { 0 } else { chunk_bytes })?,
            backward: mul(chunk_bytes, 2)?,
            keeps_head_cast: true,
        })
    }

    /// Liger-Kernel's `LigerFusedLinearCrossEntropyFunction`: see `validation/LOSSES.md`.
    fn liger(&self, tape: &mut Tape, x: T, _s: &StepShape) -> Res<LossCosts> {
        let (h, v) = (self.hidden, self.vocab);
        let tokens = tape.tokens;
        let r = x.bytes;
        // chunk rows: next power of two of ceil(BT / ceil(V / H))
        let inc = v.div_ceil(h.max(1)).max(1);
        let chunk = tokens.div_ceil(inc).max(1).next_power_of_two();
        // gradients computed in the forward and kept for backward: of the hidden states
        // and of the head weight (fp32 accumulation when the weight needs one)
        let grad_input = tape.raw(mul(tokens, h)?, r)?;
        tape.save(grad_input)?;
        if self.weight_grad_bytes > 0 {
            let gw = tape.raw(mul(v, h)?, self.weight_grad_bytes)?;
            tape.save(gw)?;
        }
        let chunk_logits = storage(mul(chunk, v)?, r)?;
        Ok(LossCosts {
            forward: add(mul(chunk_logits, 2)?, storage(mul(chunk, h)?, r)?)?,
            backward: 0,
            keeps_head_cast: false,
        })
    }

    /// Cut Cross-Entropy: the log-sum-exp per token in fp32; backward recomputes the logits
    /// block by block.
    fn cce(&self, tape: &mut Tape, x: T, _s: &StepShape) -> Res<LossCosts> {
        let (h, v) = (self.hidden, self.vocab);
        let tokens = tape.tokens;
        let r = x.bytes;
        tape.save(x)?; // the embeddings (hidden states), read again by backward
        tape.raw(tokens, 4).and_then(|t| tape.save(t))?; // lse
        tape.saved(1, 8)?; // targets
        let backward = add(
            storage(mul(tokens, h)?, r)?,
            storage(mul(v, h)?, self.weight_grad_bytes.max(r))?,
        )?;
        Ok(LossCosts {
            forward: 0,
            backward,
            keeps_head_cast: false,
        })
    }

    /// TRL's fused head (`ChunkedLogProbFunction`, from v1.15): tiles of 4096 tokens by
    /// 32,768 vocabulary entries; backward builds fp32 gradients of the hidden states and of
    /// the whole head weight.
    fn trl_fused(&self, tape: &mut Tape, x: T, _s: &StepShape) -> Res<LossCosts> {
        let (h, v) = (self.hidden, self.vocab);
        let tokens = tape.tokens;
        tape.save(x)?;
        tape.raw(tokens, 4).and_then(|t| tape.save(t))?; // log-sum-exp
        tape.saved(1, 8)?; // labels
        let tile = storage(
            mul(TRL_FUSED_TOKENS.min(tokens), TRL_FUSED_VOCAB.min(v))?,
            4,
        )?;
        let backward = add(
            add(storage(mul(tokens, h)?, 4)?, storage(mul(v, h)?, 4)?)?,
            tile,
        )?;
        Ok(LossCosts {
            forward: tile,
            backward,
            keeps_head_cast: false,
        })
    }
}

fn tokens_of(s: &StepShape) -> Res<u64> {
    mul(s.batch, s.seq)
}
