//! Model architectures: the validated form of a HF `config.json`, and the field reader the
//! family readers (`families.rs`) share.

use super::error::{ConfigError, EstimateError};
use super::family::ModelFamily;
use super::mesh::Mesh;
use super::model::{Head, Layer, ModelSpec};
use super::ops::FeedForward;
use super::peft::{LoraTargets, Naming, TargetsError};
use crate::json::{Map, Value};

/// A validated model: everything the memory model needs, as data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Architecture {
    pub(crate) family: ModelFamily,
    pub(crate) spec: Box<ModelSpec>,
    /// Longest sequence the model accepts (learned positions), if limited.
    pub(crate) max_seq: Option<u64>,
    /// The rotary positions the config declares, for serving (`None` when it gives no
    /// `max_position_embeddings`).
    pub(crate) positions: Option<super::families::Positions>,
    /// The format a quantized checkpoint stores its weights in (`quantization_config`).
    pub(crate) checkpoint: Option<crate::WeightFormat>,
    /// What the estimate covers or assumes beyond the config (shown next to the estimate).
    pub(crate) notes: Vec<&'static str>,
    /// The fields the reader used, as a compact `config.json`.
    pub(crate) compact: String,
    /// Parameters as PyTorch counts them, computed once from `spec`.
    pub(crate) n_params: u64,
    /// The vision side of a vision-language model (its language model is `spec`).
    #[cfg(feature = "vision")]
    pub(crate) vlm: Option<Box<super::vision::VisionLm>>,
    /// A hybrid's linear-attention layers (Qwen3-Next), served but not trained.
    pub(crate) linear: Option<Box<super::hybrid::LinearAttention>>,
}

/// The most elements of whole `tensors`, laid out one after the other, that touch one of
/// `group` equal pieces of their flat buffer padded to a multiple of 2 x `group` (DeepSpeed's
/// `align_dense_tensors` and `get_data_parallel_partitions`).
pub(crate) fn partition_touching(tensors: &[u64], group: u64) -> u64 {
    let group = group.max(1);
    let total = tensors.iter().fold(0u64, |a, &t| a.saturating_add(t));
    let part = (total.div_ceil(group.saturating_mul(2)).saturating_mul(2)).max(1);
    // the end of the piece being filled (divisions only when a piece is left: the advisor
    // asks this for every GPU count it tries)
    let end_of_piece = |at: u64| (at / part).saturating_add(1).saturating_mul(part);
    let (mut most, mut touching, mut start, mut piece_end) = (0u64, 0u64, 0u64, part);
    for &t in tensors.iter().filter(|&&t| t > 0) {
        let end = start.saturating_add(t);
        if start >= piece_end {
            most = most.max(touching);
            (touching, piece_end) = (0, end_of_piece(start));
        }
        touching = touching.saturating_add(t);
        if end > piece_end {
            // (the pieces between hold this tensor alone; the last starts with it)
            most = most.max(touching);
            (touching, piece_end) = (t, end_of_piece(end - 1));
        }
        start = end;
    }
    most.max(touching)
}

/// Parameter elements of one rank by FSDP unit: what FSDP2 all-gathers at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ParameterUnits {
    /// Outside the layers: embeddings, final norm, head (the root unit, gathered from the
    /// first forward to the end of backward).
    pub root: u64,
    /// The largest layer.
    pub largest_layer: u64,
    /// Every layer.
    pub layers: u64,
    /// Of those, the routed experts' (one 3-D tensor per projection, split on the expert
    /// dimension).
    pub routed: u64,
    /// Routed experts per layer (the most of any layer; 0 without).
    pub experts: u64,
    /// The largest tensor outside the layers (the embedding or the head).
    pub largest_root_tensor: u64,
    /// Of the largest layer, the weights of its linears (what torchao's float8 training
    /// converts: `nn.Linear`s, not a mixture's grouped experts).
    pub largest_layer_linears: u64,
    /// Of every layer, the same.
    pub layers_linears: u64,
}

impl ParameterUnits {
    /// Elements of one rank's shards over `group` ranks: FSDP2 pads each tensor's first
    /// dimension to a multiple of the group, which only the experts' (60 over 8 ranks: 8
    /// each) make visible.
    #[must_use]
    pub fn sharded_elements(&self, group: u64) -> u64 {
        let group = group.max(1);
        let rest = self
            .root
            .saturating_add(self.layers)
            .saturating_sub(self.routed);
        let experts = match self.experts {
            0 => 0,
            e => (self.routed / e).saturating_mul(e.div_ceil(group)),
        };
        rest.div_ceil(group).saturating_add(experts)
    }
}

impl Architecture {
    /// This architecture with `spec` in place of its own (one rank's share of it), the
    /// parameter count recomputed.
    pub(crate) fn with_spec(&self, spec: ModelSpec) -> Architecture {
        let n_params = spec
            .parameter_tensors()
            .iter()
            .fold(0u64, |a, &b| a.saturating_add(b));
        Architecture {
            family: self.family,
            spec: Box::new(spec),
            max_seq: self.max_seq,
            positions: self.positions,
            checkpoint: self.checkpoint,
            notes: self.notes.clone(),
            compact: String::new(),
            n_params,
            #[cfg(feature = "vision")]
            vlm: self.vlm.clone(),
            linear: self.linear.clone(),
        }
    }

    /// The linears that `targets` names (peft's `target_modules`: `all-linear`, `attention`,
    /// `mlp`, or module names of this model such as `q_proj,v_proj`).
    ///
    /// # Errors
    /// [`TargetsError`] for an empty list or a module name this model does not have.
    pub fn lora_targets(&self, targets: &str) -> Result<LoraTargets, TargetsError> {
        let naming = match self.family {
            ModelFamily::Gpt2 => Naming::Gpt2,
            ModelFamily::Opt => Naming::Opt,
            ModelFamily::Bert
            | ModelFamily::Roberta
            | ModelFamily::XlmRoberta
            | ModelFamily::Vit => Naming::Bert,
            _ => Naming::Llama,
        };
        LoraTargets::parse(targets, naming)
    }
    /// The model family.
    #[must_use]
    pub fn family(&self) -> ModelFamily {
        self.family
    }
    fn first_attention(&self) -> Option<&super::model::Attention> {
        self.spec.layers.first().map(|l| &l.attention)
    }
    /// Why the model is estimated for serving with vLLM only (a hybrid whose linear-attention
    /// layers the training tape does not model), if it is.
    #[must_use]
    pub fn serving_only(&self) -> Option<&'static str> {
        self.linear.as_ref().map(|_| super::hybrid::SERVING_ONLY)
    }
    /// Transformer layers.
    #[must_use]
    pub fn num_layers(&self) -> u64 {
        self.spec.layers.len() as u64
    }
    /// Hidden (model) width.
    #[must_use]
    pub fn hidden_size(&self) -> u64 {
        self.spec.hidden()
    }
    /// Attention (query) heads.
    #[must_use]
    pub fn num_heads(&self) -> u64 {
        self.first_attention().map_or(0, |a| a.heads)
    }
    /// Key/value heads (fewer than query heads under GQA).
    #[must_use]
    pub fn num_kv_heads(&self) -> u64 {
        self.first_attention().map_or(0, |a| a.kv_heads)
    }
    /// Width of one attention head.
    #[must_use]
    pub fn head_dim(&self) -> u64 {
        self.first_attention().map_or(0, |a| a.head_dim)
    }
    /// MLP inner width.
    #[must_use]
    pub fn intermediate_size(&self) -> u64 {
        self.spec.layers.first().map_or(0, |l| l.mlp.inner())
    }
    /// Vocabulary size (text) or number of classes (vision).
    #[must_use]
    pub fn vocab_size(&self) -> u64 {
        self.spec.embedding.vocab
    }
    /// Whether the input embedding and the output head share their weight.
    #[must_use]
    pub fn tie_word_embeddings(&self) -> bool {
        self.spec.tied
    }
    /// Whether this is a vision model (its `seq_len` is the image side in pixels).
    #[must_use]
    pub fn is_vision(&self) -> bool {
        self.spec.head == Head::ImageClassifier
    }
    /// Whether the model predicts the next token (where the trainers' losses apply).
    #[must_use]
    pub fn is_causal_lm(&self) -> bool {
        matches!(self.spec.head, Head::CausalLm { .. })
    }
    /// Longest sequence the model accepts (learned position embeddings), if limited.
    #[must_use]
    pub fn max_positions(&self) -> Option<u64> {
        self.max_seq
    }
    /// The format of a quantized checkpoint's weights, when its config says (AWQ, GPTQ,
    /// fp8, MXFP4).
    #[must_use]
    pub fn checkpoint_format(&self) -> Option<crate::WeightFormat> {
        self.checkpoint
    }
    /// The longest `max_model_len` vLLM allows for this config, when it declares one.
    #[must_use]
    pub fn served_context(&self) -> Option<u64> {
        self.positions.map(|p| p.context).or(self.max_seq)
    }
    /// The shortest sliding-window span of any layer, if the model uses one.
    #[must_use]
    pub fn sliding_window(&self) -> Option<u64> {
        self.spec
            .layers
            .iter()
            .filter_map(|l| l.attention.window)
            .min()
    }
    /// Layers with sliding-window attention.
    #[must_use]
    pub fn sliding_layers(&self) -> u64 {
        self.spec
            .layers
            .iter()
            .filter(|l| l.attention.window.is_some())
            .count() as u64
    }
    /// Image side in pixels (vision models; 0 otherwise).
    #[must_use]
    pub fn image_size(&self) -> u64 {
        self.spec.vision.map_or(0, |v| v.image)
    }
    /// Patch side in pixels (vision models; 0 otherwise).
    #[must_use]
    pub fn patch_size(&self) -> u64 {
        self.spec.vision.map_or(0, |v| v.patch)
    }
    /// What the estimate of this model covers or assumes beyond its config.
    #[must_use]
    pub fn notes(&self) -> &[&'static str] {
        &self.notes
    }

    /// Parameters as PyTorch counts them (tied weights once).
    #[must_use]
    pub fn parameter_count(&self) -> u64 {
        self.n_params
    }

    /// Elements of the KV cache of one sequence of `prompt` tokens followed by `generated`
    /// ones, summed over the layers, as HF transformers' cache holds them at its largest:
    /// K and V per key/value head; a sliding-window layer keeps the whole prompt after the
    /// prefill and `window` tokens once decoding starts; a latent-attention layer caches its
    /// compressed latent and rotary key (one head), not per-head K and V.
    /// `None` on overflow.
    #[must_use]
    pub fn kv_cache_elements_per_sample(&self, prompt: u64, generated: u64) -> Option<u64> {
        let total = prompt.checked_add(generated)?;
        self.spec.layers.iter().try_fold(0u64, |acc, l| {
            let a = &l.attention;
            let tokens = match a.window {
                Some(w) => total.min(prompt.max(w)),
                None => total,
            };
            let per_token = match a.latent {
                Some(lat) => lat.kv_rank.checked_add(lat.rope_dim)?,
                None => a
                    .kv_heads
                    .checked_mul(a.head_dim.checked_add(a.v_head_dim)?)?,
            };
            acc.checked_add(tokens.checked_mul(per_token)?)
        })
    }

    /// Parameters of the routed experts (what expert parallelism splits).
    #[must_use]
    pub fn routed_expert_parameter_count(&self) -> u64 {
        self.spec.layers.iter().fold(0u64, |acc, l| match l.mlp {
            super::ops::FeedForward::Moe(m) => acc.saturating_add(m.routed_params()),
            super::ops::FeedForward::Dense(_) => acc,
        })
    }

    /// Whether some layers are mixtures of experts.
    #[must_use]
    pub fn is_moe(&self) -> bool {
        self.spec
            .layers
            .iter()
            .any(|l| matches!(l.mlp, super::ops::FeedForward::Moe(_)))
    }

    /// Parameters one token goes through: all but the experts it is not routed to (equal
    /// to [`parameter_count`](Self::parameter_count) for a dense model).
    #[must_use]
    pub fn active_parameter_count(&self) -> u64 {
        let outside: u64 = self.spec.outside_parameter_tensors().iter().sum();
        let active = self.spec.layers.iter().fold(outside, |acc, l| {
            let mut ffn = Vec::new();
            l.mlp.params(&mut ffn);
            let all: u64 = l.params().iter().sum();
            let routed_off = ffn.iter().sum::<u64>() - l.mlp.active_params();
            acc.saturating_add(all - routed_off)
        });
        // a hybrid's mixers and output gates, which every token runs, in place of the
        // attention its spec holds at those layers
        match &self.linear {
            Some(_) => {
                let spec = self
                    .spec
                    .parameter_tensors()
                    .iter()
                    .fold(0u64, |a, &b| a.saturating_add(b));
                active.saturating_add(self.n_params).saturating_sub(spec)
            }
            None => active,
        }
    }

    /// Parameters of the largest transformer layer (what an FSDP all-gather materialises).
    #[must_use]
    pub fn largest_layer_parameter_count(&self) -> u64 {
        self.spec
            .layers
            .iter()
            .map(|l| l.params().iter().fold(0u64, |a, &b| a.saturating_add(b)))
            .max()
            .unwrap_or(0)
    }

    /// Parameter elements one tensor-parallel rank of `mesh` holds, by FSDP unit (one per
    /// layer, the rest in the root).
    ///
    /// # Errors
    /// When the model does not split over the mesh's tensor-parallel group.
    pub fn rank_parameter_units(&self, mesh: &Mesh) -> Result<ParameterUnits, EstimateError> {
        let mut spec = self.spec.on_rank(mesh.tensor, mesh.sequence_parallel)?;
        if let Some(stage) = &mesh.stage {
            spec = spec.stage(stage);
        }
        let sum = |v: Vec<u64>| v.iter().fold(0u64, |a, &b| a.saturating_add(b));
        // a model repeats a few kinds of layer: each run of equal layers is counted once
        let mut last: Option<(&Layer, (u64, u64))> = None;
        let layers: Vec<(u64, u64)> = spec
            .layers
            .iter()
            .map(|l| match last {
                Some((seen, n)) if seen == l => n,
                _ => {
                    let linears = l.roled_linears().iter().fold(0u64, |a, (_, x)| {
                        a.saturating_add(x.n_in.saturating_mul(x.n_out))
                    });
                    let n = (sum(l.params()), linears);
                    last = Some((l, n));
                    n
                }
            })
            .collect();
        let moe = spec.layers.iter().filter_map(|l| match &l.mlp {
            FeedForward::Moe(m) => Some((m.routed_params(), m.experts)),
            _ => None,
        });
        let (routed, experts) = moe.fold((0u64, 0u64), |(r, e), (lr, le)| {
            (r.saturating_add(lr), e.max(le))
        });
        let outside = spec.outside_parameter_tensors();
        Ok(ParameterUnits {
            largest_root_tensor: outside.iter().copied().max().unwrap_or(0),
            root: sum(outside),
            largest_layer: layers.iter().map(|l| l.0).max().unwrap_or(0),
            layers: sum(layers.iter().map(|l| l.0).collect()),
            routed,
            experts,
            largest_layer_linears: layers.iter().max().map_or(0, |l| l.1),
            layers_linears: sum(layers.iter().map(|l| l.1).collect()),
        })
    }

    /// Elements of the whole parameter tensors that touch the busiest rank's partition when
    /// DeepSpeed's ZeRO-1 and ZeRO-2 cut one tensor-parallel rank's flat 16-bit parameters
    /// into `group` pieces: the gradient partition (`grads_in_partition`) that rank keeps.
    ///
    /// # Errors
    /// When the model does not split over the mesh's tensor-parallel group.
    pub fn zero_partition_elements(&self, mesh: &Mesh, group: u64) -> Result<u64, EstimateError> {
        Ok(partition_touching(
            &self.rank_parameter_tensors(mesh)?,
            group,
        ))
    }

    /// Element counts of one tensor-parallel rank's parameter tensors in the model's order
    /// (embeddings, layers, final norm and head), as ZeRO-1 and ZeRO-2 flatten them: one
    /// optimizer group (the HF Trainer's other group, the norms' and biases', is small).
    ///
    /// # Errors
    /// When the model does not split over the mesh's tensor-parallel group.
    pub(crate) fn rank_parameter_tensors(&self, mesh: &Mesh) -> Result<Vec<u64>, EstimateError> {
        // (one GPU's model is not copied, and a run of equal layers lists its tensors once)
        let rank;
        let spec = if mesh.tensor > 1 || mesh.stage.is_some() {
            let mut on_rank = self.spec.on_rank(mesh.tensor, mesh.sequence_parallel)?;
            if let Some(stage) = &mesh.stage {
                on_rank = on_rank.stage(stage);
            }
            rank = on_rank;
            &rank
        } else {
            &self.spec
        };
        let mut tensors = spec.embedding_parameter_tensors();
        let embeddings = tensors.len();
        let mut last: Option<(&Layer, Vec<u64>)> = None;
        for l in &spec.layers {
            match &last {
                Some((seen, params)) if *seen == l => tensors.extend_from_slice(params),
                _ => {
                    let params = l.params();
                    tensors.extend_from_slice(&params);
                    last = Some((l, params));
                }
            }
        }
        tensors.extend(spec.outside_parameter_tensors().iter().skip(embeddings));
        Ok(tensors)
    }

    /// Tokens per image for a ViT at its configured size: patches plus the class token.
    pub(crate) fn vit_tokens(&self) -> u64 {
        self.spec.vision.map_or(0, |v| v.tokens())
    }

    /// A compact HF-style `config.json` that [`parse_hf_config`] turns back into `self`: the
    /// fields the reader used.
    #[must_use]
    pub fn to_config_json(&self) -> String {
        self.compact.clone()
    }
}

pub(crate) const MAX_LAYERS: u64 = 10_000;
pub(crate) const MAX_DIM: u64 = 1 << 20;
pub(crate) const MAX_VOCAB: u64 = 1 << 24;

/// Reads fields of one config object and records the ones it used (the compact form).
///
/// A read that fails does not return an error: it keeps the first one (the one a reader
/// stopping at the first bad field would report) and returns a stand-in within the field's
/// range, so that a family reader reads plain values and checks [`finish`](Self::finish)
/// once. The code that follows a failed read only ever sees in-range values, as for a valid
/// config. (Each `?` on a `Result<u64, ConfigError>` copied and dropped the error in place:
/// a third of the readers' WebAssembly.) A check of the reader's own (several fields
/// together) returns [`first`](Self::first) of the error it found, so that an earlier
/// field's error still comes first; one with nothing after it depending on it records its
/// error with [`fail`](Self::fail) and reads on.
pub(crate) struct Reader<'a> {
    m: &'a Map,
    pub used: Map,
    /// The first error met, reported by `finish` or `first`.
    err: Option<ConfigError>,
}

impl<'a> Reader<'a> {
    pub fn new(m: &'a Map) -> Self {
        Reader {
            m,
            used: Map::new(),
            err: None,
        }
    }
    fn get(&mut self, name: &str) -> Option<&'a Value> {
        match self.m.get(name) {
            None | Some(Value::Null) => None,
            Some(v) => {
                self.used.insert(name.to_string(), v.clone());
                Some(v)
            }
        }
    }
    /// Keeps `e` unless an error came before it.
    #[cold]
    #[inline(never)]
    pub fn fail(&mut self, e: ConfigError) {
        if self.err.is_none() {
            self.err = Some(e);
        }
    }
    /// Keeps `InvalidField { field, reason }` unless an error came before it (one call site
    /// per message instead of the enum built at each).
    #[cold]
    #[inline(never)]
    pub fn invalid(&mut self, field: &str, reason: String) {
        self.fail(ConfigError::InvalidField {
            field: field.to_string(),
            reason,
        });
    }
    /// The error to report where a check fails: an earlier one, or `e`.
    #[cold]
    #[inline(never)]
    pub fn first(&mut self, e: ConfigError) -> ConfigError {
        self.err.take().unwrap_or(e)
    }
    /// Takes `before`'s error as this reader's unless this one holds an error already: for a
    /// reader that reads on where `before` (a nested object's) stopped, whose own error came
    /// before `before` read anything.
    #[cfg(feature = "vision")]
    pub fn adopt(&mut self, before: &mut Reader) {
        if self.err.is_none() {
            self.err = before.err.take();
        }
    }
    /// The first error met, if any (the reader's verdict, checked once per reader).
    #[inline(never)]
    pub fn finish(&mut self) -> Result<(), ConfigError> {
        match self.err.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
    /// The first of `names` present, as a non-negative integer (`None`, the error kept, if
    /// it is not one).
    #[inline(never)]
    pub fn u64(&mut self, names: &[&str]) -> Option<u64> {
        for name in names {
            if let Some(v) = self.get(name) {
                let n = v.as_u64();
                if n.is_none() {
                    self.invalid(name, format!("expected a non-negative integer, got {v}"));
                }
                return n;
            }
        }
        None
    }
    /// A required integer in `lo..=hi` (`lo`, the error kept, if absent or invalid).
    #[inline(never)]
    pub fn req(&mut self, names: &[&str], lo: u64, hi: u64) -> u64 {
        let name = names.first().copied().unwrap_or("?");
        match self.u64(names) {
            Some(v) => self.range(name, v, lo, hi),
            None => {
                self.fail(ConfigError::MissingField(name.to_string()));
                lo
            }
        }
    }
    /// An optional integer in `lo..=hi`, or `default` (`lo`, the error kept, if invalid).
    #[inline(never)]
    pub fn opt(&mut self, names: &[&str], default: u64, lo: u64, hi: u64) -> u64 {
        let name = names.first().copied().unwrap_or("?");
        let v = self.u64(names).unwrap_or(default);
        self.range(name, v, lo, hi)
    }
    /// `v` if in `lo..=hi`, else `lo` with the error kept under `field`.
    #[inline(never)]
    pub fn range(&mut self, field: &str, v: u64, lo: u64, hi: u64) -> u64 {
        if v < lo || v > hi {
            self.invalid(field, format!("{v} is outside {lo}..={hi}"));
            lo
        } else {
            v
        }
    }
    /// A boolean, or `default` (also where invalid, the error kept).
    #[inline(never)]
    pub fn bool(&mut self, name: &str, default: bool) -> bool {
        match self.get(name) {
            None => default,
            Some(Value::Bool(b)) => *b,
            Some(v) => {
                self.invalid(name, format!("expected true or false, got {v}"));
                default
            }
        }
    }
    /// Whether a dropout probability (the first of `names` present) is above 0.
    #[inline(never)]
    pub fn prob(&mut self, names: &[&str], default: f64) -> bool {
        for name in names {
            if let Some(v) = self.get(name) {
                match v.as_f64().filter(|p| (0.0..1.0).contains(p)) {
                    Some(p) => return p > 0.0,
                    None => {
                        self.invalid(name, format!("expected a probability in [0, 1), got {v}"));
                        return false;
                    }
                }
            }
        }
        default > 0.0
    }
    /// A positive number, if present (`None`, the error kept, if invalid).
    #[inline(never)]
    pub fn positive(&mut self, name: &str) -> Option<f64> {
        let v = self.get(name)?;
        let x = v.as_f64().filter(|x| x.is_finite() && *x > 0.0);
        if x.is_none() {
            self.invalid(name, format!("expected a positive number, got {v}"));
        }
        x
    }
    /// A string, if present (`None`, the error kept, if not a string).
    #[inline(never)]
    pub fn string(&mut self, name: &str) -> Option<&'a str> {
        match self.get(name)? {
            Value::String(s) => Some(s.as_str()),
            v => {
                self.invalid(name, format!("expected a string, got {v}"));
                None
            }
        }
    }
    /// An array, if present (`None`, the error kept, if not a list).
    #[inline(never)]
    pub fn array(&mut self, name: &str) -> Option<&'a Vec<Value>> {
        match self.get(name)? {
            Value::Array(a) => Some(a),
            v => {
                self.invalid(name, format!("expected a list, got {v}"));
                None
            }
        }
    }
    /// A field's value as it is, if present (recorded).
    #[cfg(feature = "vision")]
    pub fn raw(&mut self, name: &str) -> Option<&'a Value> {
        self.get(name)
    }
    /// An object, if present (not recorded: the caller records what it reads from it;
    /// `None`, the error kept, if not an object).
    #[inline(never)]
    pub fn object(&mut self, name: &str) -> Option<&'a Map> {
        match self.m.get(name) {
            None | Some(Value::Null) => None,
            Some(Value::Object(o)) => Some(o),
            Some(v) => {
                self.invalid(name, format!("expected an object, got {v}"));
                None
            }
        }
    }
    /// A required object: the error before it, its own, or that it is missing.
    pub fn required_object(&mut self, name: &str) -> Result<&'a Map, ConfigError> {
        match self.object(name) {
            Some(o) => Ok(o),
            None => Err(self.first(ConfigError::MissingField(name.to_string()))),
        }
    }
    /// Records a value the reader derived (a nested object's used fields).
    pub fn record(&mut self, name: &str, v: Value) {
        self.used.insert(name.to_string(), v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::families::parse_hf_config;

    /// The text of `core/tests/fixtures/configs/<name>`.
    fn fixture(name: &str) -> String {
        std::fs::read_to_string(format!(
            "{}/tests/fixtures/configs/{name}",
            env!("CARGO_MANIFEST_DIR")
        ))
        .expect("fixture config")
    }

    /// ZeRO's pieces are `ceil(P / 2N) x 2` elements, and a piece keeps the gradients of
    /// every tensor it touches, whole: a tensor cut by a boundary counts on both sides.
    #[test]
    fn a_zero_partition_keeps_the_whole_tensors_it_touches() {
        for (tensors, group, expected) in [
            (&[10, 2, 2, 2, 2][..], 2, 10),
            (&[3, 10, 3], 2, 13),
            (&[20], 4, 20),
            (&[0, 1, 0, 1], 1, 2),
            (&[], 8, 0),
        ] {
            assert_eq!(partition_touching(tensors, group), expected, "{tensors:?}");
        }
        // Llama 3 8B over 64 GPUs: the piece (125.5 M elements) where the embedding ends
        // touches its 525.3 M and the first layer's tensors up to its up projection
        // (`validation/DEEPSPEED.md`: 685 M)
        let arch = parse_hf_config(&fixture("llama3-8b.json")).expect("parses");
        let mesh = Mesh::default();
        let elements = arch.zero_partition_elements(&mesh, 64).expect("splits");
        assert_eq!(elements, 684_720_128);
    }

    proptest::proptest! {
        /// The one pass over the tensors finds what counting each piece's tensors finds.
        #[test]
        fn a_zero_partition_is_the_most_any_piece_touches(
            tensors in proptest::collection::vec(0u64..50, 0..20),
            group in 1u64..9,
        ) {
            let total: u64 = tensors.iter().sum();
            let part = total.div_ceil(2 * group).max(1) * 2;
            let mut starts = Vec::new();
            let mut at = 0;
            for &t in &tensors {
                starts.push((at, at + t));
                at += t;
            }
            let most = (0..group)
                .map(|r| {
                    let (lo, hi) = (r * part, (r + 1) * part);
                    starts
                        .iter()
                        .filter(|&&(s, e)| s < e && s < hi && e > lo)
                        .map(|&(s, e)| e - s)
                        .sum::<u64>()
                })
                .max()
                .unwrap_or(0);
            proptest::prop_assert_eq!(partition_touching(&tensors, group), most);
        }
    }

    #[track_caller]
    fn count(path: &str, expected: u64) {
        let text = fixture(path);
        let arch = parse_hf_config(&text).expect("parses");
        assert_eq!(arch.parameter_count(), expected, "{path}");
        assert_eq!(
            parse_hf_config(&arch.to_config_json()).as_ref(),
            Ok(&arch),
            "{path} round trip"
        );
    }

    /// Qwen3-Next's parameters as its checkpoint's shapes add up (the MTP layer aside):
    /// embeddings and head 2 x 151,936 x 2,048; per layer two norms and the mixture (router
    /// 512 x 2,048, 512 experts and a shared expert of 3 x 2,048 x 512, the shared gate
    /// 2,048); 36 Gated DeltaNet mixers of 33,718,464 (in_proj_qkvz 12,288 x 2,048,
    /// in_proj_ba 64 x 2,048, conv1d 8,192 x 4, dt_bias and A_log 32 each, norm 128,
    /// out_proj 2,048 x 4,096) and 12 gated attentions of 27,263,488 (q_proj 8,192 x 2,048,
    /// k and v 512 x 2,048, o 2,048 x 4,096, q/k norms 256 each).
    #[test]
    fn qwen3_next_counts_its_gated_deltanet_and_gated_attention_layers() {
        let layers = 48 * (2 * 2048 + 1_048_576 + 513 * 3 * 2048 * 512 + 2048);
        let expected = 2 * 151_936 * 2048 + 2048 + layers + 36 * 33_718_464 + 12 * 27_263_488;
        assert_eq!(expected, 79_674_391_296);
        // "80B-A3B": 10 of the 512 experts and the shared one run per token, and every
        // Gated DeltaNet mixer and attention gate
        let routed_off = 48 * 502 * 3 * 2048 * 512;
        assert_eq!(expected - routed_off, 3_874_929_408);
        let name = "qwen3-next-80b-a3b-instruct.json";
        moe(name, expected, expected - routed_off);
        let text = fixture(name);
        let arch = parse_hf_config(&text).unwrap();
        assert_eq!(
            arch.serving_only(),
            Some(super::super::hybrid::SERVING_ONLY)
        );
        // a newer save lists the layer types; one without the output gate has q_proj's half
        let types =
            ["\"linear_attention\", \"linear_attention\", \"linear_attention\", \"full_attention\"";
                12];
        let listed = text.replace(
            "\"full_attention_interval\": 4,",
            &format!("\"layer_types\": [{}],", types.join(", ")),
        );
        assert_eq!(
            parse_hf_config(&listed).unwrap().parameter_count(),
            expected
        );
        let ungated = text.replace("\"head_dim\"", "\"attn_output_gate\": false, \"head_dim\"");
        assert_eq!(
            parse_hf_config(&ungated).unwrap().parameter_count(),
            expected - 12 * 2048 * 16 * 256
        );
    }

    /// EXAONE 4.0 as its shapes add up (1.2B tied: 1.07B without the embedding, as its card
    /// says; 32B untied), its norms after each sub-block, and the 32B's layers: three of
    /// 4,096-token windows with rotary, then one global without (`layer_types` or
    /// `sliding_window_pattern`, the same layout).
    #[test]
    fn exaone4_counts_and_lays_out_its_layers() {
        let layer = |h: u64, q: u64, kv: u64, d: u64, f: u64| {
            2 * h * q + 2 * h * kv + 2 * d + 3 * h * f + 2 * h
        };
        let small = 102_400 * 2048 + 30 * layer(2048, 2048, 512, 64, 4096) + 2048;
        assert_eq!(small, 1_279_391_488);
        count("exaone4-1.2b.json", small);
        let big = 2 * 102_400 * 5120 + 64 * layer(5120, 5120, 1024, 128, 27392) + 5120;
        assert_eq!(big, 32_003_216_384);
        count("exaone4-32b.json", big);
        let text = fixture("exaone4-32b.json");
        for text in [
            text.clone(),
            text.replace(
                "\"sliding_window_pattern\": 4,",
                &format!(
                    "\"layer_types\": [{}],",
                    vec!["\"sliding_attention\", \"sliding_attention\", \"sliding_attention\", \"full_attention\""; 16]
                        .join(", ")
                ),
            ),
        ] {
            let arch = parse_hf_config(&text).unwrap();
            for (i, l) in arch.spec.layers.iter().enumerate() {
                let global = i % 4 == 3;
                let a = &l.attention;
                assert_eq!(a.window, (!global).then_some(4096), "layer {i}");
                assert_eq!(a.rotary_dim, (!global).then_some(128), "layer {i}");
                assert_eq!(l.placement, super::super::model::Placement::Post);
            }
        }
        // the 1.2B has no sliding layers: every layer rotates
        let small = parse_hf_config(&fixture("exaone4-1.2b.json")).unwrap();
        assert!(small
            .spec
            .layers
            .iter()
            .all(|l| l.attention.window.is_none() && l.attention.rotary_dim == Some(64)));
    }

    #[test]
    fn recurrent_and_linear_attention_families_are_refused_by_name() {
        for model_type in ["kimi_linear", "jamba", "mamba2", "qwen3_5_moe"] {
            let why = parse_hf_config(&format!(r#"{{"model_type": "{model_type}"}}"#))
                .unwrap_err()
                .to_string();
            assert!(
                why.contains(&format!("\"{model_type}\" has")) && why.contains("recurrent state"),
                "{why}"
            );
        }
    }

    /// Without the `vision` feature a multimodal Gemma 3 config is its
    /// language model with the note saying so, and the other vision-language wrappers are
    /// model types it does not read.
    #[cfg(not(feature = "vision"))]
    #[test]
    fn multimodal_configs_are_their_language_model_without_vision() {
        let dir = env!("CARGO_MANIFEST_DIR");
        let read = |path: String| std::fs::read_to_string(path).expect("config");
        let gemma = parse_hf_config(&read(format!(
            "{dir}/tests/fixtures/configs/gemma3-4b.json"
        )))
        .expect("parses");
        assert_eq!(
            gemma.notes().first(),
            Some(&super::super::families::MULTIMODAL_NOTE)
        );
        assert_eq!(gemma.parameter_count(), 3_880_263_168);
        let qwen = parse_hf_config(&read(format!(
            "{dir}/../validation/configs/qwen2.5-vl-7b-4l.json"
        )));
        assert!(
            matches!(&qwen, Err(ConfigError::UnsupportedModelType(t)) if t == "qwen2_5_vl"),
            "{qwen:?}"
        );
    }

    /// PyTorch's counts (`sum(p.numel() for p in model.parameters())`, transformers 5.24, built
    /// from each config on the meta device).
    #[test]
    fn parameter_counts_match_pytorch() {
        count("gpt2.json", 124_439_808);
        count("gpt2-medium.json", 354_823_168);
        count("llama-1b.json", 1_235_814_400);
        count("llama3-8b.json", 8_030_261_248);
        count("bert-base.json", 109_514_298);
        count("gemma-2b.json", 2_506_172_416);
        count("mistral-7b.json", 7_241_732_096);
        count("phi3-mini-4k.json", 3_821_079_552);
        count("qwen2.5-0.5b.json", 494_032_768);
        count("llama3.1-8b.json", 8_030_261_248);
        count("llama3.2-3b.json", 3_212_749_824);
        count("llama3.3-70b.json", 70_553_706_496);
        count("qwen3-0.6b.json", 596_049_920);
        count("qwen3-1.7b.json", 1_720_574_976);
        count("qwen3-4b.json", 4_022_468_096);
        count("qwen3-8b.json", 8_190_735_360);
        count("qwen3-14b.json", 14_768_307_200);
        count("qwen3-32b.json", 32_762_123_264);
        count("gemma2-2b.json", 2_614_341_888);
        count("gemma2-9b.json", 9_241_705_984);
        count("gemma3-1b.json", 999_885_952);
        count("gemma3-4b.json", 3_880_263_168);
        count("gemma3-12b.json", 11_766_034_176);
        count("gemma3-27b.json", 27_009_346_304);
        count("olmo2-1b.json", 1_484_916_736);
        count("olmo2-7b.json", 7_298_617_344);
        count("smollm3-3b.json", 3_075_098_624);
        count("phi4-mini.json", 3_836_021_760);
        count("granite3.3-2b.json", 2_533_539_840);
        count("granite3.3-8b.json", 8_170_864_640);
        count("roberta-base.json", 124_697_433);
        count("xlm-roberta-base.json", 278_295_186);
    }

    #[test]
    fn kv_cache_follows_windows_and_latents() {
        let read = |name: &str| parse_hf_config(&fixture(name)).expect("parses");
        // Llama 3 8B: 32 layers x 2 x 8 heads x 128
        let llama = read("llama3-8b.json");
        assert_eq!(
            llama.kv_cache_elements_per_sample(1000, 24),
            Some(1024 * 32 * 2 * 8 * 128)
        );
        // gpt-oss-20b: 12 sliding layers of 128 tokens, 12 full ones, 8 kv heads of 64
        let oss = read("gpt-oss-20b.json");
        let per_token = 8 * (64 + 64);
        assert_eq!(
            oss.kv_cache_elements_per_sample(100, 900),
            Some(12 * 1000 * per_token + 12 * 128 * per_token)
        );
        // a prompt longer than the window stays whole after the prefill
        assert_eq!(
            oss.kv_cache_elements_per_sample(1000, 10),
            Some(12 * 1010 * per_token + 12 * 1000 * per_token)
        );
        // DeepSeek-V3 caches 512 + 64 latent elements per token per layer
        let ds = read("deepseek-v3.json");
        assert_eq!(ds.kv_cache_elements_per_sample(10, 0), Some(61 * 10 * 576));
    }

    #[track_caller]
    fn moe(path: &str, total: u64, active: u64) {
        count(path, total);
        let text = fixture(path);
        let arch = parse_hf_config(&text).expect("parses");
        assert!(arch.is_moe(), "{path}");
        assert_eq!(arch.active_parameter_count(), active, "{path} active");
    }

    /// Totals from PyTorch as above; active = total minus the routed experts a token skips
    /// ((E - k) / E of the routed expert parameters).
    #[test]
    fn moe_counts_match_pytorch() {
        moe("mixtral-8x7b.json", 46_702_792_704, 12_879_925_248);
        moe("qwen3-30b-a3b.json", 30_532_122_624, 3_353_032_704);
        moe("qwen3-235b-a22b.json", 235_093_634_560, 22_190_763_520);
        moe("qwen1.5-moe-a2.7b.json", 14_315_784_192, 2_689_173_504);
        moe("deepseek-v3.json", 671_026_404_352, 37_552_282_624);
        moe("moonlight-16b-a3b.json", 15_960_108_544, 2_914_774_528);
        moe("gpt-oss-20b.json", 20_914_757_184, 4_187_440_704);
        moe("gpt-oss-120b.json", 116_829_156_672, 5_711_982_912);
    }

    #[track_caller]
    fn rejects(json: &str, field: &str) {
        match parse_hf_config(json) {
            Err(e) => assert!(e.to_string().contains(field), "{e} should name {field}"),
            Ok(a) => panic!("accepted {a:?}"),
        }
    }

    const LLAMA: &str = "\"model_type\":\"llama\",\"hidden_size\":64,\"num_hidden_layers\":2,\"num_attention_heads\":4,\"intermediate_size\":8,\"vocab_size\":8";

    #[test]
    fn rejects_bad_fields() {
        rejects("[1]", "JSON");
        rejects("{\"model_type\":\"t5\"}", "t5");
        rejects("{\"model_type\":\"t5\"}", "qwen3");
        rejects(
            "{\"model_type\":\"llama\",\"hidden_size\":64}",
            "num_hidden_layers",
        );
        rejects(
            "{\"model_type\":\"llama\",\"hidden_size\":64,\"num_hidden_layers\":0,\"num_attention_heads\":4,\"intermediate_size\":8,\"vocab_size\":8}",
            "num_hidden_layers",
        );
        rejects(
            "{\"model_type\":\"llama\",\"hidden_size\":65,\"num_hidden_layers\":2,\"num_attention_heads\":4,\"intermediate_size\":8,\"vocab_size\":8}",
            "hidden_size",
        );
        rejects(
            "{\"model_type\":\"llama\",\"hidden_size\":64,\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":3,\"intermediate_size\":8,\"vocab_size\":8}",
            "num_key_value_heads",
        );
        rejects(
            &format!("{{{LLAMA},\"rope_scaling\":{{\"rope_type\":\"warp\"}}}}"),
            "rope_scaling",
        );
        rejects(
            &format!("{{{LLAMA},\"layer_types\":[\"full_attention\"]}}"),
            "layer_types",
        );
        rejects(
            "{\"model_type\":\"smollm3\",\"hidden_size\":64,\"num_hidden_layers\":2,\"num_attention_heads\":4,\"intermediate_size\":8,\"vocab_size\":8,\"no_rope_layers\":[1]}",
            "no_rope_layers",
        );
        rejects(
            "{\"model_type\":\"phi3\",\"hidden_size\":64,\"num_hidden_layers\":2,\"num_attention_heads\":4,\"intermediate_size\":8,\"vocab_size\":8,\"partial_rotary_factor\":1.5}",
            "partial_rotary_factor",
        );
        rejects("{\"model_type\":\"gemma3\"}", "text_config");
    }

    /// The first of several bad fields is the one reported, as a reader stopping at the first
    /// would (the readers read on past a bad field and report its error at the end): reads,
    /// checks over several fields, and the nested objects' readers, in the order read.
    const FIRST_ERRORS: &[(&str, &str)] = &[
        (
            r#"{"model_type":"llama","hidden_size":64,"num_hidden_layers":0,"num_attention_heads":3,"intermediate_size":0,"vocab_size":8}"#,
            r#"config field "num_hidden_layers" is invalid: 0 is outside 1..=10000"#,
        ),
        (
            r#"{"model_type":"llama","hidden_size":"64","num_hidden_layers":2,"num_attention_heads":4,"intermediate_size":8,"vocab_size":8}"#,
            r#"config field "hidden_size" is invalid: expected a non-negative integer, got "64""#,
        ),
        (
            r#"{"model_type":"llama","hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":8,"intermediate_size":8,"vocab_size":8}"#,
            r#"config field "num_key_value_heads" is invalid: 8 is outside 1..=4"#,
        ),
        (
            r#"{"model_type":"llama","hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":-1,"intermediate_size":0,"vocab_size":8}"#,
            r#"config field "num_key_value_heads" is invalid: expected a non-negative integer, got -1"#,
        ),
        (
            r#"{"model_type":"llama","hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"head_dim":1048576,"intermediate_size":8,"vocab_size":8}"#,
            r#"config field "head_dim" is invalid: 4 heads of 1048576 exceed 1048576 attention channels"#,
        ),
        (
            r#"{"model_type":"llama","hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"intermediate_size":8,"vocab_size":8,"rope_scaling":{"type":"warp"},"tie_word_embeddings":1}"#,
            r#"config field "rope_scaling" is invalid: rope type "warp" is not one of default, linear, dynamic, yarn, longrope, llama3"#,
        ),
        (
            r#"{"model_type":"llama","hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"intermediate_size":8,"vocab_size":8,"rope_scaling":[],"rope_parameters":{"rope_type":"warp"}}"#,
            r#"config field "rope_scaling" is invalid: expected an object, got []"#,
        ),
        (
            r#"{"model_type":"llama","hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"intermediate_size":8,"vocab_size":8,"attention_dropout":1.0,"mlp_bias":"no"}"#,
            r#"config field "mlp_bias" is invalid: expected true or false, got "no""#,
        ),
        (
            r#"{"model_type":"mistral","hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"intermediate_size":8,"vocab_size":8,"layer_types":["full_attention","sliding_attention"]}"#,
            r#"config field "sliding_window" is missing"#,
        ),
        (
            r#"{"model_type":"mistral","hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"intermediate_size":8,"vocab_size":8,"layer_types":["full_attention","local"],"sliding_window":-4}"#,
            r#"config field "sliding_window" is invalid: expected a non-negative integer, got -4"#,
        ),
        (
            r#"{"model_type":"mistral","hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"intermediate_size":8,"vocab_size":8,"layer_types":"full_attention"}"#,
            r#"config field "layer_types" is invalid: expected a list, got "full_attention""#,
        ),
        (
            r#"{"model_type":"qwen2","hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"intermediate_size":8,"vocab_size":8,"use_sliding_window":true,"max_window_layers":20000}"#,
            r#"config field "max_window_layers" is invalid: 20000 is outside 0..=10000"#,
        ),
        (
            r#"{"model_type":"smollm3","hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"intermediate_size":8,"vocab_size":8,"no_rope_layers":[1,2],"layer_types":["x","y"]}"#,
            r#"config field "no_rope_layers" is invalid: entries are 1 (rotary) or 0 (none), got 2"#,
        ),
        (
            r#"{"model_type":"smollm3","hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"intermediate_size":8,"vocab_size":8,"no_rope_layer_interval":0}"#,
            r#"config field "no_rope_layer_interval" is invalid: 0 is outside 1..=10000"#,
        ),
        (
            r#"{"model_type":"phi3","hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"intermediate_size":8,"vocab_size":8,"partial_rotary_factor":0.001,"resid_pdrop":2}"#,
            r#"config field "resid_pdrop" is invalid: expected a probability in [0, 1), got 2"#,
        ),
        (
            r#"{"model_type":"phi3","hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"intermediate_size":8,"vocab_size":8,"resid_pdrop":2,"partial_rotary_factor":2}"#,
            r#"config field "resid_pdrop" is invalid: expected a probability in [0, 1), got 2"#,
        ),
        (
            r#"{"model_type":"gemma2","hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"intermediate_size":8,"vocab_size":8,"attn_logit_softcapping":-1,"sliding_window":true}"#,
            r#"config field "sliding_window" is invalid: expected a non-negative integer, got true"#,
        ),
        (
            r#"{"model_type":"gemma3_text","hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"intermediate_size":8,"vocab_size":8,"sliding_window_pattern":0}"#,
            r#"config field "sliding_window_pattern" is invalid: 0 is outside 1..=10000"#,
        ),
        (
            r#"{"model_type":"granite","hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"intermediate_size":8,"vocab_size":8,"logits_scaling":0,"embedding_multiplier":"x"}"#,
            r#"config field "embedding_multiplier" is invalid: expected a positive number, got "x""#,
        ),
        (
            r#"{"model_type":"mixtral","hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"intermediate_size":8,"vocab_size":8,"num_local_experts":4,"num_experts_per_tok":5}"#,
            r#"config field "num_experts_per_tok" is invalid: 5 is outside 1..=4"#,
        ),
        (
            r#"{"model_type":"qwen2_moe","hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"intermediate_size":8,"vocab_size":8,"num_experts":4,"num_experts_per_tok":2,"moe_intermediate_size":8,"decoder_sparse_step":0,"mlp_only_layers":7}"#,
            r#"config field "decoder_sparse_step" is invalid: 0 is outside 1..=10000"#,
        ),
        (
            r#"{"model_type":"deepseek_v3","hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"intermediate_size":8,"vocab_size":8,"qk_rope_head_dim":8,"qk_nope_head_dim":8,"kv_lora_rank":0,"q_lora_rank":0,"v_head_dim":8}"#,
            r#"config field "q_lora_rank" is invalid: 0 is outside 1..=1048576"#,
        ),
        (
            r#"{"model_type":"deepseek_v3","hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"intermediate_size":8,"vocab_size":8,"qk_rope_head_dim":8,"qk_nope_head_dim":8,"kv_lora_rank":8,"v_head_dim":8,"n_routed_experts":4,"num_experts_per_tok":2,"moe_intermediate_size":8,"n_group":2,"topk_group":3,"first_k_dense_replace":-1}"#,
            r#"config field "topk_group" is invalid: 3 is outside 1..=2"#,
        ),
        (
            r#"{"model_type":"gpt_oss","hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"intermediate_size":8,"vocab_size":8,"num_local_experts":4,"num_experts_per_tok":2,"quantization_config":"mxfp4"}"#,
            r#"config field "quantization_config" is invalid: expected an object, got "mxfp4""#,
        ),
        (
            r#"{"model_type":"gpt2","n_embd":64,"n_layer":2,"n_head":5,"vocab_size":0}"#,
            r#"config field "n_embd" is invalid: 64 is not divisible by 5 heads"#,
        ),
        (
            r#"{"model_type":"gpt2","n_embd":64,"n_layer":2,"n_head":4,"vocab_size":8,"attn_pdrop":-0.1,"activation_function":3}"#,
            r#"config field "attn_pdrop" is invalid: expected a probability in [0, 1), got -0.1"#,
        ),
        (
            r#"{"model_type":"opt","hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"ffn_dim":8,"vocab_size":8,"layer_norm_elementwise_affine":false,"dropout":1}"#,
            r#"config field "layer_norm_elementwise_affine" is invalid: LayerNorms without weights are not modelled"#,
        ),
        (
            r#"{"model_type":"bert","hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"intermediate_size":8,"vocab_size":8,"max_position_embeddings":2,"pad_token_id":1,"type_vocab_size":-1}"#,
            r#"config field "type_vocab_size" is invalid: expected a non-negative integer, got -1"#,
        ),
        (
            r#"{"model_type":"roberta","hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"intermediate_size":8,"vocab_size":8,"max_position_embeddings":2,"type_vocab_size":-1}"#,
            r#"config field "max_position_embeddings" is invalid: 2 leaves no position after the padding offset 2"#,
        ),
        (
            r#"{"model_type":"vit","hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"image_size":100,"patch_size":16,"num_labels":0}"#,
            r#"config field "num_labels" is invalid: 0 is outside 1..=16777216"#,
        ),
        (
            r#"{"model_type":"vit","hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"image_size":100,"patch_size":16}"#,
            r#"config field "image_size" is invalid: 100 is not a multiple of patch_size 16"#,
        ),
    ];

    /// The same for the vision-language wrappers (their text, vision and preprocessor blocks).
    #[cfg(feature = "vision")]
    const FIRST_VISION_ERRORS: &[(&str, &str)] = &[
        (
            r#"{"model_type":"qwen2_5_vl","text_config":{"hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"intermediate_size":8,"vocab_size":8},"vision_config":{"hidden_size":30,"num_heads":4,"depth":0},"preprocessor_config":{"min_pixels":0}}"#,
            r#"config field "depth" is invalid: 0 is outside 1..=10000"#,
        ),
        (
            r#"{"model_type":"qwen2_5_vl","text_config":{"hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"intermediate_size":8,"vocab_size":8},"vision_config":{"hidden_size":32,"num_heads":4,"depth":2},"preprocessor_config":{"min_pixels":100,"max_pixels":50,"merge_size":0}}"#,
            r#"config field "preprocessor_config.max_pixels" is invalid: 50 is outside 100..=1099511627776"#,
        ),
        (
            r#"{"model_type":"qwen2_5_vl","text_config":{"hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"intermediate_size":8,"vocab_size":8},"vision_config":{"hidden_size":32,"num_heads":4,"depth":2,"window_size":0},"preprocessor_config":[]}"#,
            r#"config field "preprocessor_config" is invalid: expected an object, got []"#,
        ),
        (
            r#"{"model_type":"qwen3_vl","text_config":{"hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"intermediate_size":8,"vocab_size":8},"vision_config":{"hidden_size":32,"num_heads":4,"depth":2,"deepstack_visual_indexes":[0,5],"spatial_merge_size":0}}"#,
            r#"config field "spatial_merge_size" is invalid: 0 is outside 1..=16"#,
        ),
        (
            r#"{"model_type":"gemma3","text_config":{"hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"intermediate_size":8,"vocab_size":8},"vision_config":{"patch_size":14,"image_size":10},"mm_tokens_per_image":0}"#,
            r#"config field "vision_config.image_size" is invalid: smaller than the patch size"#,
        ),
        (
            r#"{"model_type":"gemma3","text_config":{"hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"intermediate_size":8,"vocab_size":8},"vision_config":{"patch_size":14},"mm_tokens_per_image":0,"preprocessor_config":{"size":{"height":2}}}"#,
            r#"config field "mm_tokens_per_image" is invalid: 0 is outside 1..=1048576"#,
        ),
        (
            r#"{"model_type":"idefics3","text_config":{"hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"intermediate_size":8,"vocab_size":8},"vision_config":{"patch_size":14,"image_size":28},"scale_factor":0,"preprocessor_config":{"max_image_size":{"longest_edge":7}}}"#,
            r#"config field "scale_factor" is invalid: 0 is outside 1..=64"#,
        ),
        (
            r#"{"model_type":"llava","text_config":{"hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"intermediate_size":8,"vocab_size":8},"vision_config":{"patch_size":14,"image_size":28},"vision_feature_layer":0.5,"vision_feature_select_strategy":"cls"}"#,
            r#"config field "vision_feature_layer" is invalid: expected a layer index"#,
        ),
        (
            r#"{"model_type":"llava_next","text_config":{"hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"intermediate_size":8,"vocab_size":8},"vision_config":{"patch_size":14,"image_size":28},"vision_feature_select_strategy":"cls","image_grid_pinpoints":[[28,30]]}"#,
            r#"config field "vision_feature_select_strategy" is invalid: expected "default" or "full""#,
        ),
        (
            r#"{"model_type":"llava_next","text_config":{"hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"intermediate_size":8,"vocab_size":8},"vision_config":{"patch_size":14,"image_size":28},"image_grid_pinpoints":[]}"#,
            r#"config field "image_grid_pinpoints" is invalid: expected 1 to 64 resolutions"#,
        ),
        (
            r#"{"model_type":"llava_next","text_config":{"model_type":"bert"},"vision_config":{"patch_size":0}}"#,
            r#"config field "text_config.model_type" is invalid: not a decoder language model"#,
        ),
        (
            r#"{"model_type":"mllama","text_config":{"hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"intermediate_size":8,"vocab_size":8},"vision_config":{"hidden_size":32,"attention_heads":4,"patch_size":14,"image_size":10,"max_num_tiles":0},"preprocessor_config":{"max_image_tiles":0}}"#,
            r#"config field "image_size" is invalid: 10 is outside 14..=32768"#,
        ),
        (
            r#"{"model_type":"mllama","text_config":{"hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"intermediate_size":8,"vocab_size":8},"vision_config":{"hidden_size":32,"attention_heads":4,"patch_size":14,"image_size":28},"preprocessor_config":{"size":{"height":2},"max_image_tiles":0}}"#,
            r#"config field "preprocessor_config.size" is invalid: 2 is outside 14..=32768"#,
        ),
        (
            r#"{"model_type":"mllama","text_config":{"hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"intermediate_size":8,"vocab_size":0},"vision_config":[]}"#,
            r#"config field "vocab_size" is invalid: 0 is outside 1..=16777216"#,
        ),
        (
            r#"{"model_type":"mllama","text_config":{"hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"intermediate_size":8,"vocab_size":8}}"#,
            r#"config field "vision_config" is missing"#,
        ),
        (
            r#"{"model_type":"qwen2_5_vl","text_config":3}"#,
            r#"config field "text_config" is invalid: expected an object, got 3"#,
        ),
    ];

    #[test]
    fn reports_the_first_bad_field() {
        #[cfg(feature = "vision")]
        let vision = FIRST_VISION_ERRORS;
        #[cfg(not(feature = "vision"))]
        let vision: &[(&str, &str)] = &[];
        for (config, message) in FIRST_ERRORS.iter().chain(vision) {
            match parse_hf_config(config) {
                Err(e) => assert_eq!(e.to_string(), *message, "{config}"),
                Ok(_) => panic!("accepted {config}"),
            }
        }
    }

    #[test]
    fn accepts_old_and_new_rope_fields() {
        let old = parse_hf_config(&format!("{{{LLAMA},\"rope_theta\":10000.0}}"));
        let new = parse_hf_config(&format!(
            "{{{LLAMA},\"rope_parameters\":{{\"rope_theta\":500000.0,\"rope_type\":\"default\"}}}}"
        ));
        assert_eq!(
            old.as_ref().map(Architecture::parameter_count),
            new.as_ref().map(Architecture::parameter_count)
        );
        assert_eq!(old.map(|a| a.tie_word_embeddings()), Ok(false));
        for t in ["llama3", "linear", "dynamic", "yarn"] {
            let scaled = parse_hf_config(&format!(
                "{{{LLAMA},\"rope_scaling\":{{\"rope_type\":\"{t}\",\"factor\":8.0}}}}"
            ));
            assert!(scaled.is_ok(), "{t}");
        }
    }
}
