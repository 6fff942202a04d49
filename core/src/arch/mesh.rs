//! One rank's share of a model under tensor parallelism, as torchtitan's Llama plan splits
//! it: the query, key, value, gate and up projections column-parallel (their outputs split
//! by heads or by the inner width), the output and down projections row-parallel (their
//! inputs split), the token embedding row-parallel over the vocabulary and the head
//! column-parallel over it. Norms, biases of row-parallel linears, routers and learned
//! position rows stay whole on every rank. Above `model` (it rewrites a `ModelSpec`), below
//! `config` and `estimate`, which run the rank's step on the same tape as one GPU's.

use super::error::EstimateError;
use super::model::{Head, ModelSpec, Placement};
use super::ops::FeedForward;

/// How one training step is split over GPUs, as the op kinds see it: the tensor-parallel
/// group (with or without sequence parallelism and loss parallelism) and the
/// context-parallel group. Data, pipeline and expert parallelism act on the model state and
/// the layers a rank holds, above the tape (`evaluate`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Mesh {
    /// Tensor-parallel ranks (1: none).
    pub tensor: u64,
    /// Sequence parallelism: norms, dropout and residual adds run on a slice of the tokens
    /// (the layers' linears read the all-gathered tokens).
    pub sequence_parallel: bool,
    /// Loss parallelism: the logits stay split over the vocabulary for the loss instead of
    /// being gathered whole on every rank.
    pub loss_parallel: bool,
    /// Context-parallel ranks (ring attention): each holds a slice of the sequence.
    pub context: u64,
    /// Whose tensor-parallel plan: torchtitan's, or Megatron-LM's (whose
    /// vocabulary-parallel cross-entropy keeps the logits split and works in place).
    pub plan: TpPlan,
    /// The pipeline stage this rank runs, `None` without pipeline parallelism.
    pub stage: Option<Stage>,
}

/// Whose tensor-parallel plan a rank follows. Both split q/k/v and gate/up by columns, the
/// output projections by rows and the embedding and head over the vocabulary; they differ
/// in the loss.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum TpPlan {
    /// torchtitan's Llama plan: the logits gathered whole on every rank for the loss,
    /// unless loss parallelism (PyTorch's `loss_parallel`) keeps them split.
    #[default]
    Torchtitan,
    /// Megatron-LM: `vocab_parallel_cross_entropy` on each rank's slice of the fp32 logits,
    /// the softmax computed in place of them, saved, and turned into the gradient in place
    /// (`megatron/core/tensor_parallel/cross_entropy.py`).
    Megatron,
}

impl TpPlan {
    /// Both plans, in the order the page lists them.
    pub const ALL: [TpPlan; 2] = [TpPlan::Torchtitan, TpPlan::Megatron];

    /// Short stable key used in URLs and the CLI.
    #[must_use]
    pub const fn key(self) -> &'static str {
        match self {
            TpPlan::Torchtitan => "torchtitan",
            TpPlan::Megatron => "megatron",
        }
    }

    /// Name shown to a person.
    #[must_use]
    pub const fn label(self) -> &'static str {
        match self {
            TpPlan::Torchtitan => "torchtitan",
            TpPlan::Megatron => "Megatron-LM (vocabulary-parallel loss)",
        }
    }
}

/// How a pipeline orders its micro-batches' forwards and backwards.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum PipelineSchedule {
    /// Every forward, then every backward (`ScheduleGPipe`).
    Gpipe,
    /// One forward, one backward after a warm-up (`Schedule1F1B`).
    #[default]
    OneFOneB,
    /// 1F1B over two model chunks per rank (`ScheduleInterleaved1F1B`).
    Interleaved,
}

impl PipelineSchedule {
    /// Every schedule, in the order the page lists them.
    pub const ALL: [PipelineSchedule; 3] = [
        PipelineSchedule::OneFOneB,
        PipelineSchedule::Gpipe,
        PipelineSchedule::Interleaved,
    ];

    /// Short stable key used in URLs and the CLI.
    #[must_use]
    pub const fn key(self) -> &'static str {
        match self {
            PipelineSchedule::Gpipe => "gpipe",
            PipelineSchedule::OneFOneB => "1f1b",
            PipelineSchedule::Interleaved => "interleaved",
        }
    }

    /// Name shown to a person.
    #[must_use]
    pub const fn label(self) -> &'static str {
        match self {
            PipelineSchedule::Gpipe => "GPipe (all forwards, then all backwards)",
            PipelineSchedule::OneFOneB => "1F1B (one forward, one backward)",
            PipelineSchedule::Interleaved => "Interleaved 1F1B (two chunks per GPU)",
        }
    }

    /// The schedule whose [`key`](Self::key) is `key`.
    #[must_use]
    pub fn from_key(key: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.key() == key)
    }
}

/// The forwards a pipeline stage holds at its fullest, by model chunk
/// ([`Stage::chunks_in_flight`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunksInFlight {
    /// Forwards in flight, each of one chunk.
    pub chunks: u64,
    /// Chunks per stage (each runs `1 / per_stage` of the stage's layers).
    pub per_stage: u64,
    /// Of them, the rank's first chunk's.
    pub first: u64,
    /// Of them, the rank's last chunk's.
    pub last: u64,
}

/// Model chunks per rank under the interleaved schedule (torchtitan's default).
pub const INTERLEAVED_CHUNKS: u64 = 2;

/// One pipeline stage: which part of the model a rank runs and how many micro-batches'
/// saved tensors it holds at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Stage {
    /// This stage, from 0 (the embeddings) to `stages - 1` (the head and the loss).
    pub index: u64,
    /// Pipeline ranks.
    pub stages: u64,
    /// Micro-batches per optimizer step.
    pub microbatches: u64,
    /// The schedule.
    pub schedule: PipelineSchedule,
}

impl Stage {
    /// Micro-batches whose saved tensors the stage holds at its fullest, in units of its
    /// whole share of the layers: GPipe runs every forward first; 1F1B's warm-up gives
    /// stage `i` of `p` `p - i` forwards before its first backward
    /// (`torch.distributed.pipelining.Schedule1F1B`); the interleaved schedule's forwards,
    /// each of a chunk of `1/v` of the stage's layers ([`Stage::chunks_in_flight`]),
    /// rounded up to whole stages.
    #[must_use]
    pub fn in_flight(&self) -> u64 {
        let (i, p, m) = (self.index, self.stages.max(1), self.microbatches.max(1));
        match self.schedule {
            PipelineSchedule::Gpipe => m,
            PipelineSchedule::OneFOneB => (p - i.min(p - 1)).min(m),
            PipelineSchedule::Interleaved => {
                let c = self.chunks_in_flight();
                c.chunks.div_ceil(c.per_stage)
            }
        }
    }

    /// The forwards in flight at the stage's fullest (the warm-up's and the first steady
    /// one's, before its first backward frees any), counted by model chunk: how many in all,
    /// how many of the rank's first chunk (the embeddings' on the first stage) and how many
    /// of its last (the head's and the loss's on the last stage). A chunk runs `1/v` of the
    /// stage's layers. GPipe and 1F1B run one chunk, the whole stage. The interleaved
    /// schedule (torch's `ScheduleInterleaved1F1B`) runs the micro-batches in rounds of
    /// `r = m / max(1, m / p)`, chunk after chunk (`forward_stage_index`: `(step // r) % v`),
    /// with `(v - 1) r + 2 (p - 1 - i)` warm-up forwards (`_get_warmup_ops`, at most `m v`)
    /// and one more in its steady state before the first backward.
    #[must_use]
    pub fn chunks_in_flight(&self) -> ChunksInFlight {
        let (i, p, m) = (self.index, self.stages.max(1), self.microbatches.max(1));
        if self.schedule != PipelineSchedule::Interleaved {
            let n = self.in_flight();
            return ChunksInFlight {
                chunks: n,
                per_stage: 1,
                first: n,
                last: n,
            };
        }
        let v = INTERLEAVED_CHUNKS;
        let round = m / (m / p).max(1);
        let chunks = ((v - 1) * round + 2 * (p - 1 - i.min(p - 1)) + 1).min(m * v);
        let chunk_of = |k: u64| (k / round) % v;
        ChunksInFlight {
            chunks,
            per_stage: v,
            first: (0..chunks).filter(|&k| chunk_of(k) == 0).count() as u64,
            last: (0..chunks).filter(|&k| chunk_of(k) == v - 1).count() as u64,
        }
    }

    /// The layers of a model of `layers` this stage runs: an even split, the earlier
    /// stages taking one more where it does not divide.
    #[must_use]
    pub fn layers(&self, layers: u64) -> std::ops::Range<u64> {
        let p = self.stages.max(1);
        let (each, extra) = (layers / p, layers % p);
        let start = self.index * each + self.index.min(extra);
        let len = each + u64::from(self.index < extra);
        start..start + len
    }
}

impl Mesh {
    /// One GPU, or plain data parallelism: nothing inside a step is split.
    pub const SINGLE: Mesh = Mesh {
        tensor: 1,
        sequence_parallel: false,
        loss_parallel: false,
        context: 1,
        plan: TpPlan::Torchtitan,
        stage: None,
    };

    /// Whether a step on this mesh differs from one GPU's.
    #[must_use]
    pub fn splits_the_step(&self) -> bool {
        self.tensor > 1 || self.context > 1 || self.stage.is_some_and(|s| s.stages > 1)
    }
}

impl Default for Mesh {
    fn default() -> Self {
        Mesh::SINGLE
    }
}

fn split(what: &'static str, count: u64, group: u64) -> Result<u64, EstimateError> {
    if count.is_multiple_of(group) {
        Ok(count / group)
    } else {
        Err(EstimateError::Unsplittable {
            what,
            count,
            group,
            over: "tensor-parallel GPUs",
        })
    }
}

impl ModelSpec {
    /// What one of `tp` tensor-parallel ranks holds and computes. Heads must split evenly
    /// (torchtitan asserts it); an inner width or a vocabulary that does not split evenly
    /// gives rank 0 the larger share (`torch.chunk`), which is the rank that sets the peak.
    pub(crate) fn on_rank(
        &self,
        tp: u64,
        sequence_parallel: bool,
    ) -> Result<ModelSpec, EstimateError> {
        if !matches!(self.head, Head::CausalLm { .. }) || self.vision.is_some() {
            return Err(EstimateError::MeshUnsupported(
                "tensor parallelism is modelled for causal language models (torchtitan's plan)",
            ));
        }
        if self.embedding.proj > 0 {
            return Err(EstimateError::MeshUnsupported(
                "tensor parallelism is not modelled for a model that projects its embeddings in and out",
            ));
        }
        let mut local = self.clone();
        if tp <= 1 {
            return Ok(local);
        }
        local.embedding.vocab = self.embedding.vocab.div_ceil(tp);
        for layer in &mut local.layers {
            if sequence_parallel && !matches!(layer.placement, Placement::Pre | Placement::Sandwich)
            {
                return Err(EstimateError::MeshUnsupported(
                    "sequence parallelism is modelled for layers that norm before their blocks",
                ));
            }
            let a = &mut layer.attention;
            if a.qk_norm.is_some_and(|n| !n.per_head) {
                return Err(EstimateError::MeshUnsupported(
                    "a query/key norm over the whole projection (OLMo 2) needs the heads gathered: tensor parallelism is not modelled for it",
                ));
            }
            a.heads = split("attention heads", a.heads, tp)?;
            if a.latent.is_none() {
                a.kv_heads = split("key/value heads", a.kv_heads, tp)?;
            } else {
                a.kv_heads = a.heads;
            }
            match &mut layer.mlp {
                FeedForward::Dense(m) => m.inner = m.inner.div_ceil(tp),
                FeedForward::Moe(m) => {
                    m.inner = m.inner.div_ceil(tp);
                    m.shared_inner = m.shared_inner.div_ceil(tp);
                }
            }
        }
        Ok(local)
    }

    /// The part of the model pipeline stage `stage` runs: its layers, the embeddings on
    /// the first stage, the final norm, head and loss on the last.
    pub(crate) fn stage(&self, stage: &Stage) -> ModelSpec {
        let range = stage.layers(self.layers.len() as u64);
        let (start, end) = (range.start as usize, range.end as usize);
        ModelSpec {
            layers: self.layers[start.min(self.layers.len())..end.min(self.layers.len())].to_vec(),
            embeds: self.embeds && stage.index == 0,
            heads: self.heads && stage.index + 1 >= stage.stages,
            ..self.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn chunks(index: u64, stages: u64, microbatches: u64, expected: (u64, u64, u64)) {
        let c = Stage {
            index,
            stages,
            microbatches,
            schedule: PipelineSchedule::Interleaved,
        }
        .chunks_in_flight();
        assert_eq!((c.chunks, c.first, c.last), expected);
        assert_eq!(c.per_stage, INTERLEAVED_CHUNKS);
    }

    /// The interleaved schedule's forwards before a stage's first backward, by chunk: the
    /// last of 2 stages runs its first chunk for micro-batches 0 and 1, then its last chunk
    /// (the head's) for micro-batch 0, whose backward comes next (measured with
    /// `ScheduleInterleaved1F1B`: `validation/pipeline.py`, within 1.7% of every stage).
    #[test]
    fn interleaved_stages_count_their_chunks_in_flight() {
        chunks(1, 2, 4, (3, 2, 1));
        chunks(0, 2, 4, (5, 3, 2));
        chunks(3, 4, 8, (5, 4, 1));
        chunks(0, 4, 8, (11, 7, 4));
        // fewer micro-batches than the warm-up: every chunk of each
        chunks(0, 4, 1, (2, 1, 1));
        // GPipe and 1F1B run the whole stage as one chunk
        let gpipe = Stage {
            index: 0,
            stages: 2,
            microbatches: 4,
            schedule: PipelineSchedule::Gpipe,
        }
        .chunks_in_flight();
        assert_eq!(
            (gpipe.chunks, gpipe.per_stage, gpipe.first, gpipe.last),
            (4, 1, 4, 4)
        );
    }
}
