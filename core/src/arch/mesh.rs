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
}

impl Mesh {
    /// One GPU, or plain data parallelism: nothing inside a step is split.
    pub const SINGLE: Mesh = Mesh {
        tensor: 1,
        sequence_parallel: false,
        loss_parallel: false,
        context: 1,
    };

    /// Whether a step on this mesh differs from one GPU's.
    #[must_use]
    pub const fn splits_the_step(&self) -> bool {
        self.tensor > 1 || self.context > 1
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
        Err(EstimateError::Unsplittable { what, count, group })
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
        if tp <= 1 {
            return Ok(self.clone());
        }
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
}
