//! The head and its cross-entropy as each trainer runs them: what they save for backward and
//! what lives for a moment around them. The trainers agree on the loss's value and differ in
//! what they keep of the vocabulary-sized logits, which is most of the step's memory for a
//! small model with a large vocabulary (Qwen3-0.6B: 151,936 entries for a hidden size of 1024).
//!
//! Each rule is read off the pinned source (`validation/LOSSES.md`) and, where the loss runs
//! on the CPU, checked against the harness (`validation/trainers.py`,
//! `tests/fixtures/trainers-measured.jsonl`).

use super::ops::{add, mul, storage, Linear, Res, SavedPart, Tape, T};
use super::peft::Role;
use super::recipe::{Compile, LossKind};
use super::replay::{LossOp, LossTensors};
use super::shape::StepShape;

/// TRL's `_CHUNKED_LM_HEAD_CHUNK_SIZE`: valid tokens per chunk of `chunked_nll`.
pub(crate) const TRL_CHUNK_TOKENS: u64 = 256;
/// torchtune's `num_output_chunks` in its recipes.
pub(crate) const TORCHTUNE_CHUNKS: u64 = 8;
/// TRL's `entropy_from_logits` default: rows per chunk of its no-gradient entropy.
const TRL_ENTROPY_ROWS: u64 = 128;
/// TRL's `ChunkedLogProbFunction` tiles (`trl/kernels/chunked_logprob.py`).
pub(crate) const TRL_FUSED_TOKENS: u64 = 4096;
pub(crate) const TRL_FUSED_VOCAB: u64 = 32_768;

/// The causal-LM head as the loss sees it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CausalHead {
    pub hidden: u64,
    pub vocab: u64,
    /// Gemma 2's `tanh` soft-capping of the logits.
    pub softcap: bool,
    /// Whether the loss runs in the head's graph when the whole model is compiled.
    pub loss_in_graph: bool,
    /// Bytes per element of the head weight's gradient (0 when it is frozen).
    pub weight_grad_bytes: u64,
    /// Bytes per element of the head weight.
    pub weight_bytes: u64,
}

/// What the loss adds to the step beyond the tensors it saved on the tape.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct LossCosts {
    /// Alive for a moment at the forward's loss, beyond the saved tensors.
    pub forward: u64,
    /// Alive for a moment after the model's forward has returned (its autocast context and
    /// cast cache gone), beyond the saved tensors: TRL's metrics on the output logits.
    pub after_forward: u64,
    /// Alive at the start of backward, beyond the saved tensors: the loss's gradient buffers,
    /// or the chunked losses' recomputed chunk with its gradients.
    pub backward: u64,
    /// Whether autocast's 16-bit copy of the head weight is saved for backward (the head runs
    /// as `lm_head` once); the chunked losses cast it again per chunk instead.
    pub keeps_head_cast: bool,
    /// The loss's tensors one by one for the allocator's replay, where they are read off
    /// the source (else `forward` and `backward` are replayed as one block each).
    pub tensors: Option<LossTensors>,
}

/// SFTTrainer's metrics under no_grad on the model's output logits, which accelerate's
/// `convert_outputs_to_fp32` (Trainer with bf16=True, SFTConfig's default) made an fp32 copy
/// of: `entropy_from_logits` flattens the shifted logits (a copy when the batch has more than
/// one row) and runs log_softmax, exp and their product per 128 rows, in fp32.
fn trl_metrics(s: &StepShape, v: u64, tv: u64) -> Res<u64> {
    let shifted = mul(mul(s.batch, s.seq.saturating_sub(1))?, v)?;
    let copy = if s.batch > 1 { storage(shifted, 4)? } else { 0 };
    let rows = mul(TRL_ENTROPY_ROWS, v)?;
    add(add(storage(tv, 4)?, copy)?, mul(storage(rows, 4)?, 3)?)
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
        if s.compile.loss() && !s.loss_parallel && !s.in_place_loss && !self.softcap {
            return self.compiled_loss(kind, tape, logits, s);
        }
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
            trl_metrics(s, v, tv)?
        } else {
            0
        };
        // Loss parallel's backward (`_nll_loss_and_log_softmax_backward` in
        // torch/distributed/tensor/parallel/loss.py) computes `(grad_input + exp(x)) *
        // grad_output` on the slice: a zeroed gradient, the exponential and their sum live
        // together, one fp32 slice more than `nll_loss` and `log_softmax`'s backward (measured:
        // validation/distributed.py)
        let backward_slices = if s.loss_parallel { 3 } else { 2 };
        // Megatron's backward turns the saved softmax into the gradient in place: only the
        // 16-bit cast of it for the head's backward is new
        let backward = if s.in_place_loss {
            logits_w
        } else {
            mul(logits_32, backward_slices)?
        };
        let tensors = (!s.loss_parallel && !s.in_place_loss)
            .then(|| Self::upcast_tensors(logits_w, if w == 4 { 0 } else { logits_32 }));
        Ok(LossCosts {
            forward: at_loss,
            after_forward: forward,
            backward,
            keeps_head_cast: true,
            tensors,
        })
    }

    /// transformers' `ForCausalLMLoss` (5.24) tensor by tensor, for the allocator's replay:
    /// the head's logits, their fp32 copy (`logits.float()`; none when `upcast` is 0: they are
    /// fp32 already), `log_softmax`'s output (saved; the copy is freed when the loss function
    /// returns, the logits when the model's output is dropped). Backward: `nll_loss`'s
    /// gradient, `log_softmax`'s (then the first is freed with the saved output, as the
    /// engine releases a node's inputs and saved variables once it has run), the cast back to
    /// the logits' dtype (`ToCopyBackward`, freeing the fp32 one), then the head's gradients.
    /// The sizes are what makes the reserve at long contexts: each is a segment of its own, and
    /// which freed one the next request reuses decides how many the step needs.
    fn upcast_tensors(logits: u64, upcast: u64) -> LossTensors {
        use LossOp::{Free, HeadGradients, Make};
        let fp32 = if upcast == 0 { logits } else { upcast };
        if upcast == 0 {
            return LossTensors {
                forward: vec![Make(logits), Make(fp32), Free(0)],
                backward: vec![Make(fp32), Make(fp32), Free(2), Free(1), HeadGradients],
            };
        }
        LossTensors {
            forward: vec![Make(logits), Make(upcast), Make(fp32), Free(1), Free(0)],
            backward: vec![
                Make(fp32),
                Make(fp32),
                Free(3),
                Free(2),
                Make(logits),
                Free(4),
                HeadGradients,
            ],
        }
    }

    /// The loss compiled (on its own per block, or with the whole model), measured on
    /// Llama-3.2-1B and checked against inductor (`validation/COMPILE.md`): the partitioner
    /// keeps the logits in their own dtype (16-bit under bf16 and autocast) with the
    /// per-token fp32 max and log-sum-exp and the labels, never the fp32 upcast nor the
    /// log_softmax; inductor's forward makes no vocabulary-sized buffer (max and log-sum-exp
    /// are reductions over the 16-bit logits) and its backward exactly one, the logits'
    /// gradient in their dtype. (TRL's metrics run after the forward, outside the graph.)
    fn compiled_loss(
        &self,
        kind: LossKind,
        tape: &mut Tape,
        logits: T,
        s: &StepShape,
    ) -> Res<LossCosts> {
        tape.save(logits)?;
        tape.saved(1, 4)?; // amax
        tape.saved(1, 4)?; // log(sum(exp))
        tape.saved(1, 8)?; // shifted labels
        let tv = mul(tape.tokens, self.vocab)?;
        let after_forward = if kind == LossKind::TrlNll {
            trl_metrics(s, self.vocab, tv)?
        } else {
            0
        };
        // Compiled whole with the head, the graph also returns the logits, which the loss's
        // backward gives no gradient: autograd passes a zero tangent of their size, alive
        // beside their gradient (inductor's `tangents_2`, measured on real CPU tensors:
        // `validation/COMPILE.md`)
        let gradients = if s.compile == Compile::Model && self.loss_in_graph {
            2
        } else {
            1
        };
        Ok(LossCosts {
            forward: 0,
            after_forward,
            backward: mul(storage(tv, logits.bytes)?, gradients)?,
            keeps_head_cast: true,
            tensors: None,
        })
    }

    /// TRL's `chunked_nll` (`sft_trainer._chunked_cross_entropy_loss`, v1.7 to v1.13): the
    /// shifted hidden states gathered valid tokens first, then `lm_head` and the loss per
    /// 256 tokens under non-reentrant checkpointing: only the gathered hidden states, the
    /// sort order and the labels outlive the forward (measured with TRL's own code:
    /// `validation/trainers.py`).
    fn trl_chunked(&self, tape: &mut Tape, x: T, s: &StepShape) -> Res<LossCosts> {
        let (h, v) = (self.hidden, self.vocab);
        let shifted = mul(s.batch, s.seq.saturating_sub(1))?;
        let r = x.bytes;
        // `hidden[..., :-1, :].reshape(-1, H)` copies a batch of more than one row, freed
        // once gathered; the gather by the sort order outlives it (the chunks are its views)
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
        // a chunk: its fp32 logits, log_softmax, and the entropy's exp and product
        // (soft-capping one more); under autocast a fresh 16-bit copy of the weight's
        // transpose (not a leaf: never cached)
        let chunk_tensors = if self.softcap { 5 } else { 4 };
        let weight_cast = if s.d.amp { storage(mul(v, h)?, 2)? } else { 0 };
        let one_chunk = add(mul(cv4, chunk_tensors)?, weight_cast)?;
        // the final norm's output stays referenced by the patched forward
        let norm_out = storage(mul(tape.tokens, h)?, r)?;
        let forward = add(norm_out, flat.max(one_chunk))?;
        // backward, one chunk at a time: the running sums of the hidden states' gradient and
        // of the head weight's (autograd adds each chunk's out of place: the old sum, the new
        // gradient and the result at once), and the recomputed chunk with its gradients
        let vh_grad = storage(mul(v, h)?, self.weight_grad_bytes)?;
        let sums = add(storage(mul(shifted, h)?, r)?, vh_grad)?;
        let backward = add(sums, one_chunk.max(mul(vh_grad, 2)?))?;
        Ok(LossCosts {
            forward,
            after_forward: 0,
            backward,
            keeps_head_cast: false,
            tensors: None,
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
        if s.compile.loss() {
            // torchtune's `compile_loss` compiles the per-chunk cross-entropy: each chunk's
            // 16-bit logits (a separate output of the head) are kept with their per-token
            // max and log-sum-exp, and backward makes one chunk's gradient in their dtype
            // (the rule measured on transformers' loss, applied per chunk: not measured)
            for _ in 0..chunks {
                let t = tape.raw(per_chunk, w)?;
                tape.save(t)?;
            }
            tape.saved(1, 4)?; // amax
            tape.saved(1, 4)?; // log(sum(exp))
            tape.saved(1, 8)?; // labels
            return Ok(LossCosts {
                forward: 0,
                after_forward: 0,
                backward: storage(per_chunk, w)?,
                keeps_head_cast: true,
                tensors: None,
            });
        }
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
            after_forward: 0,
            backward: mul(chunk_bytes, 2)?,
            keeps_head_cast: true,
            tensors: None,
        })
    }

    /// Liger-Kernel 0.8.5's `LigerFusedLinearCrossEntropyFunction` (`validation/LOSSES.md`
    /// section 1): the gradients of the hidden states and of the head weight are built in the
    /// forward, chunk by chunk, and kept for backward, which only scales them in place.
    fn liger(&self, tape: &mut Tape, x: T, s: &StepShape) -> Res<LossCosts> {
        let (h, v) = (self.hidden, self.vocab);
        let tokens = tape.tokens;
        let a = x.bytes;
        // rows per chunk: the next power of two of ceil(T / ceil(V / H)), at most T
        let inc = v.div_ceil(h.max(1)).max(1);
        let chunk = tokens.div_ceil(inc).max(1).next_power_of_two().min(tokens);
        let grad_input = tape.raw(mul(tokens, h)?, a)?;
        tape.save(grad_input)?;
        let trainable = self.weight_grad_bytes > 0;
        if trainable {
            let gw = tape.raw(mul(v, h)?, self.weight_bytes)?;
            tape.save(gw)?;
        }
        let vh = mul(v, h)?;
        // the logits chunk stays in the matmul's dtype (upcast in registers)
        let compute = if s.d.act == 4 { 4 } else { 2 };
        let chunk_logits = storage(mul(chunk, v)?, compute)?;
        let extra = if s.d.amp {
            // autocast caches a 16-bit copy of the weight and casts its transpose per chunk
            add(mul(storage(vh, 2)?, 2)?, storage(mul(chunk, h)?, 2)?)?
        } else if s.d.act == 4 && trainable {
            storage(vh, 4)? // the weight gradient's per-chunk fp32 temporary
        } else {
            0
        };
        Ok(LossCosts {
            forward: add(chunk_logits, extra)?,
            after_forward: 0,
            backward: 0,
            keeps_head_cast: false,
            tensors: None,
        })
    }

    /// Cut Cross-Entropy 25.1.1 (`linear_cross_entropy`, `validation/LOSSES.md` section 2):
    /// the log-sum-exp per token and the mean logit per vocabulary entry, in fp32; backward
    /// recomputes the logits block by block into the gradients of the hidden states and of
    /// the head weight, both in the hidden states' 16-bit dtype.
    fn cce(&self, tape: &mut Tape, x: T, _s: &StepShape) -> Res<LossCosts> {
        let (h, v) = (self.hidden, self.vocab);
        let tokens = tape.tokens;
        // the kernel takes 16-bit hidden states: under autocast the caller casts them
        let e = tape.cast(x, 2)?;
        tape.save(e)?;
        tape.raw(tokens, 4).and_then(|t| tape.save(t))?; // lse
        tape.raw(v, 4).and_then(|t| tape.save(t))?; // logit_avg
        tape.raw(tokens, 8).and_then(|t| tape.save(t))?; // valid positions (shift=True)
        let vh = mul(v, h)?;
        let weight_grads = if self.weight_grad_bytes > 0 {
            // `dc` in the hidden states' dtype, copied to an fp32 weight's dtype at return
            add(
                storage(vh, 2)?,
                if self.weight_bytes == 4 {
                    storage(vh, 4)?
                } else {
                    0
                },
            )?
        } else {
            0
        };
        let backward = add(
            add(storage(mul(tokens, h)?, 2)?, weight_grads)?,
            add(storage(v, 8)?, storage(tokens, 4)?)?,
        )?;
        Ok(LossCosts {
            forward: add(storage(tokens, 8)?, storage(tokens, 1)?)?,
            after_forward: 0,
            backward,
            keeps_head_cast: false,
            tensors: None,
        })
    }

    /// TRL's fused head (`ChunkedLogProbFunction`, v1.15 on; `validation/LOSSES.md` section
    /// 3): the valid rows' hidden states gathered and kept; tiles of 4096 tokens by 32,768
    /// vocabulary entries; backward accumulates fp32 gradients of the gathered hidden states
    /// and of the whole head weight, copied to the parameters' dtype at its return.
    fn trl_fused(&self, tape: &mut Tape, x: T, s: &StepShape) -> Res<LossCosts> {
        let (h, v) = (self.hidden, self.vocab);
        let scored = s.scored_per_row.unwrap_or(s.seq.saturating_sub(1));
        let n = mul(s.batch, scored.min(s.seq))?.max(1);
        let a = x.bytes;
        let compact = tape.raw(mul(n, h)?, a)?; // hidden_states[mask]
        tape.save(compact)?;
        tape.raw(n, 8).and_then(|t| tape.save(t))?; // labels[mask]
        tape.raw(n, 4).and_then(|t| tape.save(t))?; // log_z
        tape.raw(n, 4).and_then(|t| tape.save(t))?; // entropy
        let m = n.min(TRL_FUSED_TOKENS);
        let compute = if s.d.act == 4 { 4 } else { 2 };
        let tile = storage(mul(m, TRL_FUSED_VOCAB.min(v))?, compute)?;
        let amp_casts = if s.d.amp {
            add(
                storage(mul(m, h)?, 2)?,
                storage(mul(TRL_FUSED_VOCAB.min(v), h)?, 2)?,
            )?
        } else {
            0
        };
        let stats = mul(storage(n, 4)?, 7)?;
        let forward = add(add(stats, tile)?, add(amp_casts, mul(storage(n, 4)?, 3)?)?)?;
        let nh = mul(n, h)?;
        let vh = mul(v, h)?;
        let trainable = self.weight_grad_bytes > 0;
        // fp32 accumulators, and their copies in the parameters' dtype at the return
        let mut backward = add(add(storage(nh, 4)?, tile)?, amp_casts)?;
        if a != 4 {
            backward = add(backward, storage(nh, a)?)?;
        }
        if trainable {
            backward = add(backward, storage(vh, 4)?)?;
            if self.weight_bytes != 4 {
                backward = add(backward, storage(vh, self.weight_bytes)?)?;
            }
        }
        Ok(LossCosts {
            forward,
            after_forward: 0,
            backward,
            keeps_head_cast: false,
            tensors: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::ops::Dtypes;

    const MIB: f64 = 1048576.0;

    /// The bytes `kind` saves and its forward and backward transients, for `tokens` rows of
    /// 16-bit hidden states (one sequence) and a trainable 16-bit head.
    fn bf16_loss(kind: LossKind, tokens: u64, h: u64, v: u64) -> (u64, LossCosts) {
        let d = Dtypes {
            amp: false,
            act: 2,
            weight: 2,
        };
        let s = StepShape {
            batch: 1,
            seq: tokens,
            eager: false,
            flash2: false,
            mask: false,
            loss: kind,
            head_grad_bytes: 2,
            head_weight_bytes: 2,
            d,
            peft: None,
            seq_shards: 1,
            loss_vocab: v,
            loss_parallel: false,
            in_place_loss: false,
            compile: crate::arch::recipe::Compile::Off,
            checkpointed: false,
            scored_per_row: None,
            unsloth: false,
        };
        let head = CausalHead {
            hidden: h,
            vocab: v,
            softcap: false,
            loss_in_graph: true,
            weight_grad_bytes: 2,
            weight_bytes: 2,
        };
        let mut tape = Tape::new(tokens);
        let x = tape.tensor(h, 2).unwrap();
        let costs = head.loss(kind, &mut tape, x, &s).unwrap();
        (tape.total(), costs)
    }

    #[track_caller]
    fn near_mib(ours: u64, published_mib: f64, tolerance_mib: f64) {
        let ours = ours as f64 / MIB;
        assert!(
            (ours - published_mib).abs() <= tolerance_mib,
            "{ours:.2} MiB against {published_mib} MiB published"
        );
    }

    /// CCE's README (Gemma 2 2B head, 8,192 tokens, bf16, A100): the loss's forward takes
    /// 1.1 MiB beyond its inputs and its backward 1163.0 MiB.
    #[test]
    fn cce_matches_its_published_table() {
        let (t, h, v) = (8192, 2304, 256_000);
        let (saved, costs) = bf16_loss(LossKind::Cce, t, h, v);
        // our tape also keeps the hidden states themselves, an input in CCE's table
        let hidden = storage(t * h, 2).unwrap();
        near_mib(saved - hidden + costs.forward, 1.1, 0.3);
        near_mib(costs.backward, 1163.0, 1.0);
    }

    /// Liger's fused-linear-cross-entropy memory benchmark (H 4096, V 128256, bf16, A100;
    /// `benchmark/data/all_benchmark_data.csv`, measured with Liger 0.4.2, whose chunk took
    /// 8 bytes per logit where 0.8.5 takes 2): the harness holds two heads' weights, the
    /// weight's gradient, the input and its gradient besides the loss's own tensors, and
    /// some 16 MiB of CUDA workspace.
    #[test]
    fn liger_matches_its_published_benchmark() {
        let (h, v) = (4096, 128_256);
        for (t, published) in [
            (4096, 4245.55),
            (8192, 4466.97),
            (16384, 4910.44),
            (32768, 5794.63),
        ] {
            let (saved, costs) = bf16_loss(LossKind::Liger, t, h, v);
            let w = storage(v * h, 2).unwrap();
            let input = storage(t * h, 2).unwrap();
            let harness = 3 * w + 2 * input;
            let chunk = t.div_ceil(v.div_ceil(h)).next_power_of_two();
            let older_chunk = 6.0 * (chunk * v) as f64 / MIB;
            near_mib(
                harness + saved + costs.forward,
                published - older_chunk - 16.5,
                1.5,
            );
        }
    }

    #[test]
    fn chunked_losses_keep_no_vocabulary_sized_tensor() {
        let (t, h, v) = (8192, 1024, 151_936);
        let logits_32 = storage(t * v, 4).unwrap();
        let (hf_saved, hf) = bf16_loss(LossKind::Hf, t, h, v);
        assert!(hf_saved >= logits_32 && hf.backward == 2 * logits_32);
        for kind in [
            LossKind::TrlChunked,
            LossKind::Liger,
            LossKind::Cce,
            LossKind::TrlFused,
        ] {
            let (saved, costs) = bf16_loss(kind, t, h, v);
            assert!(saved < logits_32 / 4, "{kind:?} saves {saved}");
            assert!(costs.forward < logits_32 / 4, "{kind:?}: {costs:?}");
            assert!(costs.backward < logits_32, "{kind:?}: {costs:?}");
        }
        // torchtune's chunks bound only the fp32 upcast: every chunk's log_softmax is kept
        let (tt_saved, tt) = bf16_loss(LossKind::TorchtuneChunked, t, h, v);
        assert!(tt_saved >= logits_32);
        assert_eq!(tt.backward, hf.backward / TORCHTUNE_CHUNKS);
    }
}
