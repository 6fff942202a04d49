//! Serving with vLLM: how many tokens of KV cache vLLM's V1 engine gives a model on a GPU, and
//! how many requests of `max_model_len` tokens they hold.
//!
//! Followed: vLLM v0.11.0 (`validation/VLLM.md` cites each step). A worker may take
//! `gpu_memory_utilization x total` of the device; the weights, the profiling run's torch
//! peak and the memory outside torch come off it, and what is left is cut into pages of
//! `block_size` tokens (`gpu_worker.determine_available_memory`,
//! `kv_cache_utils.get_kv_cache_config_from_groups`). CUDA graphs are captured afterwards,
//! in the `1 - U` headroom. vLLM itself is not run: the weights and the KV arithmetic
//! follow its source exactly; the profile's peak, the memory outside torch and the graphs
//! are derived from it (see `validation/VLLM.md` section 9).

use crate::arch::served::{self, KvLayer};
use crate::{Architecture, Field, KvDtype, WeightFormat};

/// Bytes in one GiB (2^30): every figure vLLM logs is in these.
const GIB: u64 = 1 << 30;

/// `gpu_memory_utilization` when none is given (`CacheConfig`).
pub const DEFAULT_UTILIZATION_PPM: u32 = 900_000;

/// vLLM's block size on CUDA (`CudaPlatform.check_and_update_config`).
const BLOCK_SIZE: u64 = 16;
/// The block size the MLA backends force: FlashMLA on Hopper.
const MLA_BLOCK_SIZE: u64 = 64;
/// CUTLASS MLA, Blackwell's default MLA backend.
const MLA_BLOCK_SIZE_BLACKWELL: u64 = 128;

impl ServeDevice {
    /// Tokens per page of an MLA model (`CudaPlatform.check_and_update_config`): FlashMLA's
    /// 64 on Hopper, CUTLASS MLA's 128 on Blackwell, the default elsewhere (Triton MLA).
    fn mla_block_size(self) -> u64 {
        match self.compute_capability {
            100 => MLA_BLOCK_SIZE_BLACKWELL,
            90 => MLA_BLOCK_SIZE,
            _ => BLOCK_SIZE,
        }
    }

    /// What the NCCL communicator of torch's tensor-parallel group holds on each rank, in
    /// bytes, when `tp` ranks share the model (none for one). vLLM's own communicators are
    /// set up before the profile's first snapshot, but torch's is created lazily at its
    /// first collective, the sampler's logits gather inside the profile, so its buffers land
    /// in the profile's memory outside torch (`validation/VLLM.md` 9.3). NCCL 2.27.3 (torch
    /// 2.8's), with cuMem on (vLLM 0.11 no longer turns it off), connects only the ring the
    /// all-gather takes: per channel a 10 MiB receive and a 2 MiB send buffer (LL, LL128 and
    /// SIMPLE, each rounded to 2 MiB pages), three 2 MiB bookkeeping pages per channel of
    /// `pow2Up(channels)`, two for the device communicator, and with NVLink SHARP (Hopper
    /// and Blackwell switches, more than two ranks) one more page per channel. NCCL picks
    /// its channels by link bandwidth: 24 over A100's and H100's NVSwitch, 32 over B200's,
    /// 2 over PCIe; not by the number of ranks. AMD's RCCL is not derived: nothing added.
    fn tp_communicator_bytes(self, tp: u64) -> u64 {
        const PAGE: u64 = 2 << 20;
        if tp <= 1 || self.rocm {
            return 0;
        }
        let channels = match (self.nvswitch, self.compute_capability) {
            (true, c) if c >= 100 => 32,
            (true, _) => 24,
            (false, _) => 2,
        };
        let nvls = self.nvswitch && self.compute_capability >= 90 && tp > 2;
        let ring = channels * 6 * PAGE;
        let bookkeeping = (3 * u64::next_power_of_two(channels) + 2) * PAGE;
        ring + bookkeeping + if nvls { (channels + 1) * PAGE } else { 0 }
    }

    /// How the MXFP4 MoE kernel pads each rank's experts (`Mxfp4MoEMethod.create_weights`):
    /// the inner width per rank and the hidden width rounded up to these. Marlin below
    /// Hopper, Triton on Hopper and consumer Blackwell, FlashInfer on B200, AMD's kernels
    /// on ROCm.
    fn mxfp4_padding(self) -> (u64, u64) {
        match (self.rocm, self.compute_capability) {
            (true, _) | (false, 100) => (256, 256),
            (false, c) if c < 90 => (128, 256),
            _ => (64, 1),
        }
    }
}

/// Bytes per logit beside the 16-bit logits at the sampler's peak: PyTorch's top-k/top-p
/// sort (fp32 copy, sorted values, int64 indices, the sort's scratch) and FlashInfer's
/// sampling (a masked fp32 copy and the probabilities) (`validation/VLLM.md` 9.1).
const SORT_SAMPLER_BYTES_PER_LOGIT: u64 = 36;
const FLASHINFER_SAMPLER_BYTES_PER_LOGIT: u64 = 12;

/// Memory outside torch that grows during the profile on one GPU (kernels loaded lazily,
/// cuBLAS handles): the one breakdown vLLM V1 printed, 0.21 GiB (8 x L40S, whose PCIe
/// communicator holds a few dozen MiB of it; v0.10.2; `validation/VLLM.md` 9.3). With
/// tensor parallelism the communicator is added ([`ServeDevice::tp_communicator_bytes`]).
const NON_TORCH_BYTES: u64 = 215 << 20;

/// What each captured CUDA graph keeps beyond the shared pool (its nodes, the driver's
/// bookkeeping): the published captures span 0.25-0.8 MiB per piecewise graph
/// (`validation/VLLM.md` 9.4), this is their middle.
const BYTES_PER_GRAPH: u64 = 512 << 10;

/// The device as vLLM's worker sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServeDevice {
    /// `torch.cuda.mem_get_info()[1]`: the total the driver reports (below nvidia-smi's).
    pub total_bytes: u64,
    /// A "large" GPU for the scheduler's defaults: at least 70 GiB and not an A100
    /// (`EngineArgs._set_default_args`).
    pub large: bool,
    /// CUDA compute capability times ten (90 for Hopper): it picks the MLA backend (its page
    /// size) and the MXFP4 kernels (their padding).
    pub compute_capability: u32,
    /// An AMD GPU (ROCm).
    pub rocm: bool,
    /// An SXM board on an NVSwitch (A100, H100, H200, B200 servers): NCCL's rings get many
    /// channels ([`Self::tp_communicator_bytes`]); PCIe boards get two.
    pub nvswitch: bool,
}

/// vLLM's knobs, validated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VllmSettings {
    /// `gpu_memory_utilization`, in parts per million of the device's total.
    pub utilization_ppm: u32,
    /// `tensor_parallel_size`.
    pub tensor_parallel: u64,
    /// `max_model_len` (`None`: the model's own, as vLLM derives it).
    pub max_model_len: Option<u64>,
    /// `max_num_seqs` (`None`: the default for the device).
    pub max_num_seqs: Option<u64>,
    /// `max_num_batched_tokens` (`None`: the default for the device).
    pub max_num_batched_tokens: Option<u64>,
    /// How the checkpoint stores its weights.
    pub weight_format: WeightFormat,
    /// `kv_cache_dtype` (`auto` is the model's dtype).
    pub kv_dtype: KvDtype,
    /// `enforce_eager`: no CUDA graphs.
    pub enforce_eager: bool,
    /// FlashInfer's top-k/top-p sampler (installed with vLLM's Docker image; without it,
    /// PyTorch's sort, which the profile charges three times the bytes).
    pub flashinfer_sampler: bool,
    /// `enable_expert_parallel`: a mixture's routed experts spread whole over the
    /// tensor-parallel ranks (EP = TP) instead of each split on its inner width.
    pub expert_parallel: bool,
}

impl Default for VllmSettings {
    fn default() -> Self {
        Self {
            utilization_ppm: DEFAULT_UTILIZATION_PPM,
            tensor_parallel: 1,
            max_model_len: None,
            max_num_seqs: None,
            max_num_batched_tokens: None,
            weight_format: WeightFormat::Recipe,
            kv_dtype: KvDtype::Model,
            enforce_eager: false,
            flashinfer_sampler: false,
            expert_parallel: false,
        }
    }
}

/// The device as vLLM's worker sees it and vLLM's settings: what serving a model needs
/// beside the model.
pub type ServeInputs = (ServeDevice, VllmSettings);

/// What vLLM's start-up makes of a model on one GPU of its tensor-parallel group.
#[derive(Clone, Debug, PartialEq)]
pub struct Serving {
    /// The device's total (`mem_get_info`).
    pub device_total_bytes: u64,
    /// `gpu_memory_utilization x total`: what the worker may take.
    pub requested_bytes: u64,
    /// The weights on this GPU (`Model loading took`).
    pub weights_bytes: u64,
    /// The profiling run's torch peak over the weights (`torch peak memory increase`).
    pub activation_bytes: u64,
    /// Memory outside torch grown during the profile (`non-torch forward increase memory`).
    pub non_torch_bytes: u64,
    /// A vision-language model's profile: the dummy items its encoder ran ("profiled with N
    /// image items"; 0 for a text model), the encoder budget in tokens, and the bytes of
    /// their features kept through the forward and the sampler (part of `activation_bytes`).
    pub encoder_items: u64,
    /// See [`Self::encoder_items`].
    pub encoder_budget: u64,
    /// See [`Self::encoder_items`].
    pub encoder_kept_bytes: u64,
    /// `Available KV cache memory`: requested less the three above (negative: none).
    pub available_kv_bytes: i64,
    /// The KV cache allocated: blocks x page x layers per group.
    pub kv_cache_bytes: u64,
    /// Tokens per page.
    pub block_size: u64,
    /// Blocks in the pool.
    pub num_blocks: u64,
    /// KV cache groups (one for a model with one attention type).
    pub kv_groups: u64,
    /// Layers per group (the pool's tensors).
    pub layers_per_group: u64,
    /// KV bytes one token takes over all layers on this GPU.
    pub kv_bytes_per_token: u64,
    /// A hybrid's recurrent states one request holds over its linear-attention layers on
    /// this GPU, whatever its length: a page each (0 without such layers).
    pub state_bytes_per_request: u64,
    /// `GPU KV cache size: N tokens` (a hybrid's priced as if every layer were full).
    pub kv_cache_tokens: u64,
    /// The `max_model_len` in force.
    pub max_model_len: u64,
    /// `Maximum concurrency for max_model_len tokens per request`.
    pub max_concurrency: Concurrency,
    /// Whether one request of `max_model_len` fits (else vLLM refuses to start).
    pub max_model_len_fits: bool,
    /// The longest `max_model_len` one request can have (`estimate_max_model_len`), up to the
    /// model's own limit.
    pub largest_max_model_len: u64,
    /// `max_num_seqs` in force.
    pub max_num_seqs: u64,
    /// `max_num_batched_tokens` in force.
    pub max_num_batched_tokens: u64,
    /// What capturing CUDA graphs takes, after the sizing (0 with `enforce_eager`).
    pub cuda_graph_bytes: u64,
    /// `(1 - U) x total`: where the graphs must fit.
    pub headroom_bytes: u64,
    /// The concurrency at other lengths of request (the pool the same): powers of two from
    /// 1,024 tokens to the model's context, and the length in force.
    pub sweep: Vec<ServeRow>,
}

/// `Maximum concurrency`: the pool's blocks over those one request takes, kept as the two
/// counts (shown with integer arithmetic: the page carries no float formatting).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Concurrency {
    /// Blocks in the pool.
    pub blocks: u64,
    /// Blocks one request of `max_model_len` tokens takes over the groups.
    pub blocks_per_request: u64,
}

impl Concurrency {
    /// In hundredths, rounded to the nearest as vLLM's `%.2f` prints it.
    #[must_use]
    pub fn hundredths(self) -> u64 {
        let per = u128::from(self.blocks_per_request.max(1));
        let h = (u128::from(self.blocks) * 200 + per) / (2 * per);
        u64::try_from(h).unwrap_or(u64::MAX)
    }

    /// As a number (for JSON).
    #[must_use]
    #[allow(clippy::cast_precision_loss)] // (hundredths of block counts: far below 2^53)
    pub fn as_f64(self) -> f64 {
        self.hundredths() as f64 / 100.0
    }
}

impl std::fmt::Display for Concurrency {
    /// `12.34x`, as vLLM's log prints it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let h = self.hundredths();
        write!(f, "{}.{:02}x", h / 100, h % 100)
    }
}

/// The pool's concurrency at one `max_model_len`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ServeRow {
    /// Tokens per request.
    pub max_model_len: u64,
    /// `Maximum concurrency` at that length.
    pub max_concurrency: Concurrency,
    /// Whether one request of that length fits (vLLM starts).
    pub fits: bool,
}

/// A change that lets vLLM start (or hold more), with what it gives.
#[derive(Clone, Debug, PartialEq)]
pub struct ServeChange {
    /// What to change, for a person.
    pub label: &'static str,
    /// The new value the label names (0: the label says it all).
    pub value: u64,
    /// The fields and their new values (as the URL writes them).
    pub changes: Vec<(Field, String)>,
    /// The start-up with the change.
    pub serving: Serving,
}

impl Serving {
    /// Whether the CUDA graphs fit in the headroom `gpu_memory_utilization` leaves.
    #[must_use]
    pub fn graphs_fit(&self) -> bool {
        self.cuda_graph_bytes <= self.headroom_bytes
    }
}

/// Bytes of one KV element in `dtype` (the model's dtype being 16-bit), or why vLLM has no
/// such cache dtype: its caches are plain, one element a block.
fn kv_element_bytes(dtype: KvDtype) -> Result<u64, (Field, String)> {
    let block = dtype.block(2);
    if block.elements == 1 {
        return Ok(block.bits / 8);
    }
    Err((
        Field::KvDtype,
        format!(
            "vLLM's kv_cache_dtype is auto or fp8, not {} (a llama.cpp cache).",
            dtype.key()
        ),
    ))
}

/// One rank's weights in `format`, or why vLLM does not load that format.
fn weights_bytes(w: served::RankWeights, format: WeightFormat) -> Result<u64, (Field, String)> {
    let (linear, experts) = format.vllm_blocks().ok_or_else(|| {
        (
            Field::WeightFormat,
            format!(
                "{} is a llama.cpp file: serve it with llama.cpp, or pick bf16, fp8, AWQ/GPTQ int4 or MXFP4 for vLLM.",
                format.label()
            ),
        )
    })?;
    let half = |n: u64| n.saturating_mul(2);
    Ok(half(w.sixteen_bit)
        .saturating_add(w.rope_table_bytes)
        .saturating_add(linear.bytes(w.linear).unwrap_or(u64::MAX))
        .saturating_add(experts.bytes(w.experts).unwrap_or(u64::MAX)))
}

/// What a layer keeps of a request, the type vLLM groups its layers by (`get_kv_cache_groups`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Span {
    /// Every token (full attention).
    Full,
    /// The last tokens of a sliding window this wide.
    Window(u64),
    /// One recurrent state, whatever the length (`MambaSpec`).
    State,
}

impl Span {
    fn of(layer: &KvLayer) -> Self {
        match (layer.state_bytes, layer.window) {
            (1.., _) => Span::State,
            (0, Some(w)) => Span::Window(w),
            (0, None) => Span::Full,
        }
    }

    /// Blocks one request of `len` tokens needs in a layer of this span
    /// (`max_memory_usage_bytes` / page): a sliding window keeps its last `W - 1` tokens and
    /// the step's new ones, plus one block for a window that starts mid-block; a state one
    /// block (v0.11 keeps no state per prefix: prefix caching is off for hybrids).
    fn blocks(self, len: u64, batched: u64, block: u64) -> u64 {
        match self {
            Span::Full => len.div_ceil(block),
            Span::Window(w) => (w - 1 + batched).min(len).div_ceil(block) + 1,
            Span::State => 1,
        }
    }
}

/// The layers' spans as vLLM groups them (`get_kv_cache_groups`): the count of each distinct
/// span, in order of first appearance.
fn spans(layers: &[KvLayer]) -> Vec<(Span, u64)> {
    let mut types: Vec<(Span, u64)> = Vec::new();
    for span in layers.iter().map(Span::of) {
        match types.iter_mut().find(|(s, _)| *s == span) {
            Some((_, n)) => *n += 1,
            None => types.push((span, 1)),
        }
    }
    types
}

/// The longest `max_model_len` searched for a model whose config gives no context.
const MAX_LEN_SEARCHED: u64 = 1 << 24;

/// The KV cache's layout (`kv_cache_utils`): one page size for every layer, the layers
/// grouped by what they keep, one pool of blocks the groups share.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct KvPool {
    /// Each layer's span.
    layers: Vec<Span>,
    /// Each group's span.
    groups: Vec<Span>,
    /// Layers per group: the fewest of any attention type (`group_size`).
    layers_per_group: u64,
    /// Bytes of one block of one layer (`page_size_bytes`).
    page: u64,
    block_size: u64,
    /// `max_num_batched_tokens` (a sliding window's request holds the step's new tokens).
    batched: u64,
    /// Bytes of one token over every layer.
    bytes_per_token: u64,
}

impl KvPool {
    /// The pool of `layers`, `kv_bytes` per element, pages of `block_size` tokens; with
    /// recurrent states, of as many more tokens as a state needs.
    pub(crate) fn new(layers: &[KvLayer], kv_bytes: u64, block_size: u64, batched: u64) -> Self {
        // every layer's page is the largest: vLLM asks them to be equal
        let per_token = layers
            .iter()
            .map(|l| l.elements_per_token * kv_bytes)
            .max()
            .unwrap_or(0)
            .max(1);
        // a hybrid's attention pages grow to hold a state, in steps of the kernel's 16
        // tokens, and the state's page is padded to them
        // (`HybridAttentionMambaModelConfig.verify_and_update_config`)
        let state = layers.iter().map(|l| l.state_bytes).max().unwrap_or(0);
        let block_size = block_size.max(state.div_ceil(BLOCK_SIZE * per_token) * BLOCK_SIZE);
        let types = spans(layers);
        let layers_per_group = types.iter().map(|(_, n)| *n).min().unwrap_or(1).max(1);
        // each type cut into groups of `layers_per_group` (its last padded)
        let groups = types
            .iter()
            .flat_map(|&(w, n)| {
                std::iter::repeat_n(
                    w,
                    usize::try_from(n.div_ceil(layers_per_group)).unwrap_or(0),
                )
            })
            .collect();
        KvPool {
            layers: layers.iter().map(Span::of).collect(),
            groups,
            layers_per_group,
            page: (block_size * per_token).max(1),
            block_size,
            batched,
            bytes_per_token: layers.iter().map(|l| l.elements_per_token * kv_bytes).sum(),
        }
    }

    /// Bytes of the states one request holds: a (padded) page per state layer.
    pub(crate) fn state_bytes_per_request(&self) -> u64 {
        self.layers.iter().filter(|s| **s == Span::State).count() as u64 * self.page
    }

    /// Blocks in a pool of `available` bytes (`get_num_blocks`): one tensor per layer of a
    /// group, each shared by a layer of every group.
    pub(crate) fn blocks(&self, available: u64) -> u64 {
        available / self.page / self.layers_per_group
    }

    /// `GPU KV cache size`: the blocks split over the groups, as tokens.
    pub(crate) fn tokens(&self, blocks: u64) -> u64 {
        blocks / (self.groups.len().max(1) as u64) * self.block_size
    }

    /// `Maximum concurrency` (`get_max_concurrency_for_kv_cache_config`): the blocks over
    /// those one request of `len` tokens takes in every group.
    pub(crate) fn concurrency(&self, blocks: u64, len: u64) -> Concurrency {
        let per_request: u64 = self
            .groups
            .iter()
            .map(|s| s.blocks(len, self.batched, self.block_size))
            .sum();
        Concurrency {
            blocks,
            blocks_per_request: per_request.max(1),
        }
    }

    /// Whether one request of `len` tokens fits in `available` bytes (else vLLM refuses to
    /// start).
    pub(crate) fn fits(&self, len: u64, available: u64) -> bool {
        available > 0 && self.needed(len) <= available
    }

    /// Bytes one request of `len` tokens needs over every layer (`max_memory_usage_bytes`,
    /// what `check_enough_kv_cache_memory` holds against the available memory).
    pub(crate) fn needed(&self, len: u64) -> u64 {
        self.layers
            .iter()
            .map(|s| s.blocks(len, self.batched, self.block_size))
            .sum::<u64>()
            .saturating_mul(self.page)
    }
}

/// The scheduler's defaults for `vllm serve` (`EngineArgs._set_default_args`):
/// (`max_num_batched_tokens`, `max_num_seqs`).
fn scheduler_defaults(large: bool) -> (u64, u64) {
    if large {
        (8192, 1024)
    } else {
        (2048, 256)
    }
}

/// About what capturing CUDA graphs takes after the sizing (v0.11.0's `capture_model`):
/// one pool shared by every capture size (`[1, 2, 4]` and multiples of 8 up to
/// `min(2 x max_num_seqs, 512)`), captured largest first, so it holds the largest size's
/// working set; and what each piecewise graph (one per layer and size) keeps.
fn cuda_graph_bytes(
    arch: &Architecture,
    (tp, ep): (u64, bool),
    max_num_seqs: u64,
    max_model_len: u64,
) -> u64 {
    let largest = (2 * max_num_seqs).clamp(1, 512);
    let sizes = 3 + largest / 8;
    let pool =
        served::forward_peak_bytes(arch, tp, ep, largest, largest, max_model_len, BLOCK_SIZE);
    let graphs = (arch.num_layers() + 1) * sizes;
    pool.saturating_add(graphs.saturating_mul(BYTES_PER_GRAPH))
}

/// vLLM's start-up for `arch` on `device` with `settings`, or the field whose value vLLM
/// would refuse and why.
pub fn serve_vllm(
    arch: &Architecture,
    device: ServeDevice,
    settings: &VllmSettings,
) -> Result<Serving, (Field, String)> {
    if !arch.is_causal_lm() {
        return Err((
            Field::Model,
            "vLLM sizes a KV cache for generative models: this one generates nothing.".to_owned(),
        ));
    }
    let tp = settings.tensor_parallel.max(1);
    if let Some(why) = served::tp_error(arch, tp) {
        return Err((Field::TensorParallel, why));
    }
    let kv_bytes = kv_element_bytes(settings.kv_dtype)?;
    // the recipe's format is the checkpoint's: its quantization_config, else 16 bits
    let format = match settings.weight_format {
        WeightFormat::Recipe => arch.checkpoint_format().unwrap_or(WeightFormat::Recipe),
        f => f,
    };
    // (a dense model has no experts to spread: vLLM ignores the flag)
    let ep = settings.expert_parallel && arch.is_moe();
    let mut rank = served::rank_weights(arch, tp, ep);
    if format == WeightFormat::Mxfp4 {
        // the kernel's layout: padded experts, their scales and 16-bit biases, counted apart
        let (inner, hidden) = device.mxfp4_padding();
        let (experts, biases) = served::mxfp4_experts(arch, tp, ep, inner, hidden);
        rank.sixteen_bit = rank.sixteen_bit.saturating_sub(biases) + experts / 2;
        rank.experts = 0;
    }
    // a vision-language model's tower and projector load with it, in 16 bits (quantized
    // checkpoints leave them so), their linears split by TP
    #[cfg(feature = "vision")]
    if let Some(vlm) = arch.vlm.as_deref() {
        rank.sixteen_bit += vlm.parameter_count() / tp;
    }
    let weights_bytes = weights_bytes(rank, format)?;
    let context = arch.served_context();
    let max_model_len = match (settings.max_model_len, context) {
        (Some(len), Some(limit)) if len > limit => {
            return Err((
                Field::MaxModelLen,
                format!(
                    "The model's context is {limit} tokens (its config's positions): vLLM refuses a longer max_model_len."
                ),
            ))
        }
        (Some(len), _) => len,
        (None, Some(limit)) => limit,
        (None, None) => {
            return Err((
                Field::MaxModelLen,
                "The config gives no max_position_embeddings: give a max_model_len.".to_owned(),
            ))
        }
    };
    let (default_tokens, default_seqs) = scheduler_defaults(device.large);
    let max_num_batched_tokens = settings.max_num_batched_tokens.unwrap_or(default_tokens);
    let max_num_seqs = settings
        .max_num_seqs
        .unwrap_or(default_seqs.min(max_num_batched_tokens));
    // Qwen3-VL's language model keeps a buffer for the deepstack features of a step's
    // tokens, made with the model (`Qwen3VLForConditionalGeneration.__init__`)
    #[cfg(feature = "vision")]
    let weights_bytes = weights_bytes.saturating_add(arch.vlm.as_deref().map_or(0, |vlm| {
        vlm.deepstack
            .saturating_mul(max_num_batched_tokens)
            .saturating_mul(2 * vlm.lm_hidden)
    }));

    // the profile: a forward of max_num_batched_tokens, then the sampler over one row per request
    let requests = max_num_seqs.min(max_num_batched_tokens);
    let layers = served::kv_layers(arch, tp);
    let block_size = if layers.iter().any(|l| l.latent) {
        device.mla_block_size()
    } else {
        BLOCK_SIZE
    };
    let forward = served::forward_peak_bytes(
        arch,
        tp,
        ep,
        max_num_batched_tokens,
        requests,
        max_model_len,
        block_size,
    );
    let per_logit = if settings.flashinfer_sampler {
        FLASHINFER_SAMPLER_BYTES_PER_LOGIT
    } else {
        SORT_SAMPLER_BYTES_PER_LOGIT
    };
    let sampler = served::sampler_peak_bytes(arch, max_num_batched_tokens, requests, per_logit);
    // a vision-language model's encoder runs first; its features stay through the rest
    #[cfg(feature = "vision")]
    let encoder = served::encoder_profile(
        arch,
        tp,
        max_num_batched_tokens,
        max_num_seqs,
        max_model_len,
    )
    .map_err(|why| (Field::Model, why.to_owned()))?;
    #[cfg(not(feature = "vision"))]
    let encoder: Option<served::EncoderProfile> = None;
    let activation_bytes = match encoder {
        Some(e) => e.run_bytes.max(e.kept_bytes + forward.max(sampler)),
        None => forward.max(sampler),
    };
    let non_torch_bytes = NON_TORCH_BYTES + device.tp_communicator_bytes(tp);

    let total = device.total_bytes;
    let requested_bytes =
        u64::try_from(u128::from(total) * u128::from(settings.utilization_ppm) / 1_000_000)
            .unwrap_or(u64::MAX);
    let non_kv = weights_bytes
        .saturating_add(activation_bytes)
        .saturating_add(non_torch_bytes);
    let available_kv_bytes =
        i64::try_from(i128::from(requested_bytes) - i128::from(non_kv)).unwrap_or(i64::MIN);
    let available = u64::try_from(available_kv_bytes).unwrap_or(0);

    let pool = KvPool::new(&layers, kv_bytes, block_size, max_num_batched_tokens);
    let num_blocks = pool.blocks(available);
    let limit = context.unwrap_or(MAX_LEN_SEARCHED).max(max_model_len);

    let cuda_graph_bytes = if settings.enforce_eager {
        0
    } else {
        cuda_graph_bytes(arch, (tp, ep), max_num_seqs, max_model_len)
    };
    Ok(Serving {
        device_total_bytes: total,
        requested_bytes,
        weights_bytes,
        activation_bytes,
        non_torch_bytes,
        encoder_items: encoder.map_or(0, |e| e.items),
        encoder_budget: encoder.map_or(0, |e| e.budget),
        encoder_kept_bytes: encoder.map_or(0, |e| e.kept_bytes),
        available_kv_bytes,
        kv_cache_bytes: num_blocks * pool.page * pool.layers_per_group,
        block_size: pool.block_size,
        num_blocks,
        kv_groups: pool.groups.len() as u64,
        layers_per_group: pool.layers_per_group,
        kv_bytes_per_token: pool.bytes_per_token,
        state_bytes_per_request: pool.state_bytes_per_request(),
        kv_cache_tokens: pool.tokens(num_blocks),
        max_model_len,
        max_concurrency: pool.concurrency(num_blocks, max_model_len),
        max_model_len_fits: pool.fits(max_model_len, available),
        largest_max_model_len: largest_len(limit, |len| pool.fits(len, available)),
        max_num_seqs,
        max_num_batched_tokens,
        cuda_graph_bytes,
        headroom_bytes: total.saturating_sub(requested_bytes),
        sweep: sweep_lengths(
            context.unwrap_or(max_model_len).max(max_model_len),
            max_model_len,
        )
        .map(|len| ServeRow {
            max_model_len: len,
            max_concurrency: pool.concurrency(num_blocks, len),
            fits: pool.fits(len, available),
        })
        .collect(),
    })
}

/// The sweep's lengths: powers of two from 1,024 up to `limit`, and `chosen` in its place.
fn sweep_lengths(limit: u64, chosen: u64) -> impl Iterator<Item = u64> {
    let mut lengths: Vec<u64> = (10..=24)
        .map(|p| 1u64 << p)
        .take_while(|&len| len <= limit)
        .collect();
    if let Err(i) = lengths.binary_search(&chosen) {
        lengths.insert(i, chosen);
    }
    lengths.into_iter()
}

/// One change [`serve_advice`] tries: whether it applies, its label, its value, the fields it
/// sets and the settings it gives.
type Try = (bool, &'static str, u64, Vec<(Field, String)>, VllmSettings);

/// What to change when one request of `max_model_len` does not fit (or no KV memory is
/// left) in `now`, vLLM's start-up with `settings`: each of a higher
/// `gpu_memory_utilization`, an fp8 KV cache, an fp8 or int4 checkpoint, twice the tensor
/// parallelism and the longest `max_model_len` that fits, kept when vLLM then starts; in that order, the least disruptive first (a setting, the cache's
/// precision, the weights', more GPUs, shorter requests).
#[must_use]
pub fn serve_advice(
    arch: &Architecture,
    device: ServeDevice,
    settings: &VllmSettings,
    now: &Serving,
) -> Vec<ServeChange> {
    if now.max_model_len_fits {
        return Vec::new();
    }
    let s = *settings;
    let tp = s.tensor_parallel.max(1) * 2;
    let len = now.largest_max_model_len;
    let sixteen_bit = matches!(s.weight_format, WeightFormat::Recipe | WeightFormat::Half)
        && arch.checkpoint_format().is_none();
    // (whether it applies, what to change, its value where the label needs one, the fields
    // and the settings)
    let tries: [Try; 6] = [
        (
            s.utilization_ppm < 950_000,
            "gpu_memory_utilization 0.95",
            0,
            vec![(Field::GpuMemoryUtilization, "0.95".into())],
            VllmSettings {
                utilization_ppm: 950_000,
                ..s
            },
        ),
        (
            s.kv_dtype == KvDtype::Model,
            "An fp8 KV cache (--kv-cache-dtype fp8)",
            0,
            vec![(Field::KvDtype, "fp8".into())],
            VllmSettings {
                kv_dtype: KvDtype::Fp8,
                ..s
            },
        ),
        (
            sixteen_bit,
            "An fp8 checkpoint",
            0,
            vec![(Field::WeightFormat, "fp8".into())],
            VllmSettings {
                weight_format: WeightFormat::Fp8,
                ..s
            },
        ),
        (
            sixteen_bit,
            "An AWQ / GPTQ int4 checkpoint",
            0,
            vec![(Field::WeightFormat, "int4-g128".into())],
            VllmSettings {
                weight_format: WeightFormat::Int4Group128,
                ..s
            },
        ),
        (
            tp <= 8,
            "Tensor parallelism (GPUs per server):",
            tp,
            vec![
                (Field::TensorParallel, tp.to_string()),
                (Field::NumGpus, tp.to_string()),
            ],
            VllmSettings {
                tensor_parallel: tp,
                ..s
            },
        ),
        (
            len > 0,
            "max_model_len:",
            len,
            vec![(Field::MaxModelLen, len.to_string())],
            VllmSettings {
                max_model_len: Some(len),
                ..s
            },
        ),
    ];
    tries
        .into_iter()
        .filter(|t| t.0)
        .filter_map(|(_, label, value, changes, settings)| {
            let serving = serve_vllm(arch, device, &settings).ok()?;
            serving.max_model_len_fits.then_some(ServeChange {
                label,
                value,
                changes,
                serving,
            })
        })
        .collect()
}

/// The largest `len` in `1..=limit` for which `fits` holds (0 if none): vLLM's binary search
/// in `estimate_max_model_len`, `fits` being monotone.
fn largest_len(limit: u64, fits: impl Fn(u64) -> bool) -> u64 {
    let (mut lo, mut hi, mut best) = (1u64, limit, 0u64);
    while lo <= hi {
        let mid = lo + (hi - lo) / 2;
        if fits(mid) {
            best = mid;
            lo = mid + 1;
        } else {
            hi = mid - 1;
        }
    }
    best
}

/// GiB (2^30) as vLLM prints them, two decimals.
#[must_use]
pub fn vllm_gib(bytes: u64) -> String {
    // (below 2^64 / 100 bytes the product cannot overflow; beyond, the figure saturates)
    let hundredths = bytes.saturating_mul(100).saturating_add(GIB / 2) / GIB;
    format!("{}.{:02}", hundredths / 100, hundredths % 100)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Preset;

    fn arch(key: &str) -> Architecture {
        Preset::from_key(key)
            .expect("preset")
            .architecture()
            .expect("parses")
    }

    /// vLLM's pool for `arch` on `tp` ranks, pages of `block` tokens.
    fn pool(arch: &Architecture, tp: u64, kv_bytes: u64, batched: u64) -> KvPool {
        KvPool::new(&served::kv_layers(arch, tp), kv_bytes, BLOCK_SIZE, batched)
    }

    /// A start-up log's figures: the available memory it printed (GiB, two decimals), the
    /// tokens and the concurrency at `len` it printed for it.
    #[track_caller]
    fn assert_log(
        id: &str,
        pool: &KvPool,
        available_gib: f64,
        tokens: u64,
        len: u64,
        concurrency: f64,
    ) {
        // the printed GiB stand for anything within half a hundredth
        let bytes = |gib: f64| (gib * GIB as f64) as u64;
        let (lo, hi) = (
            pool.blocks(bytes(available_gib - 0.005)),
            pool.blocks(bytes(available_gib + 0.005)),
        );
        // vLLM prints the concurrency with "%.2f"
        let printed = |b: u64| pool.concurrency(b, len).to_string();
        let matching = (lo..=hi)
            .find(|&b| pool.tokens(b) == tokens && printed(b) == format!("{concurrency:.2}x"));
        assert!(
            matching.is_some(),
            "{id}: {tokens} tokens, {concurrency}x: ours {}..={} tokens, {}x..={}x for {available_gib} GiB",
            pool.tokens(lo),
            pool.tokens(hi),
            printed(lo),
            printed(hi)
        );
    }

    /// A vision-language config of `validation/configs/` with its published layer counts.
    #[cfg(feature = "vision")]
    fn vlm(config: &str, layers: &[(&str, &str)]) -> Architecture {
        let mut text = config.to_owned();
        for (from, to) in layers {
            text = text.replace(from, to);
        }
        crate::parse_hf_config(&text).expect("parses")
    }

    #[cfg(feature = "vision")]
    #[test]
    fn a_vision_language_model_s_profile_runs_as_many_dummy_images_as_vllm_logs() {
        let h100 = crate::Gpu::H100_80.serve_device(None).unwrap();
        let serve = |arch: &Architecture, batched, len| {
            let settings = VllmSettings {
                max_num_batched_tokens: Some(batched),
                max_model_len: Some(len),
                ..VllmSettings::default()
            };
            serve_vllm(arch, h100, &settings).expect("serves")
        };
        // LLaVA-NeXT-Mistral-7B at vLLM's LLM() defaults on an H100: "Model loading took
        // 14.0786 GiB", "budget of 16384 tokens, and profiled with 5 image items" (v0.10.2;
        // VLLM.md 9.7); each item's 2,928 features padded to the budget by v0.11.0
        let llava = vlm(
            include_str!("../../validation/configs/llava-v1.6-mistral-7b-4l.json"),
            &[
                ("\"num_hidden_layers\": 4", "\"num_hidden_layers\": 32"),
                ("\"num_hidden_layers\": 6", "\"num_hidden_layers\": 24"),
            ],
        );
        let s = serve(&llava, 16_384, 4096);
        assert_eq!((s.encoder_items, s.encoder_budget), (5, 16_384));
        assert_eq!(s.encoder_kept_bytes, 5 * 16_384 * 4096 * 2);
        let logged = 14.0786 * f64::from(1u32 << 30);
        assert!(
            (s.weights_bytes as f64 / logged - 1.0).abs() < 0.005,
            "{}",
            s.weights_bytes
        );
        // Gemma 3: 260 tokens an image ("\n\n", BOI, 256, EOI, "\n\n"): 31 at 8,192, 7 at 2,048
        let gemma = vlm(
            include_str!("../../validation/configs/gemma3-4b-vl-6l.json"),
            &[],
        );
        let s = serve(&gemma, 8192, 4096);
        assert_eq!(
            (s.encoder_items, s.encoder_kept_bytes),
            (31, 31 * 8192 * 2560 * 2)
        );
        assert_eq!(serve(&gemma, 2048, 4096).encoder_items, 7);
        // Qwen2.5-VL: one image at max_pixels (16,384 tokens, the budget itself: no padding);
        // from 32k tokens a video of up to 14 frames wins
        let qwen = vlm(
            include_str!("../../validation/configs/qwen2.5-vl-7b-4l.json"),
            &[],
        );
        let s = serve(&qwen, 2048, 8192);
        assert_eq!((s.encoder_items, s.encoder_budget), (1, 16_384));
        assert_eq!(s.encoder_kept_bytes, 16_384 * 3584 * 2);
        assert_eq!(serve(&qwen, 2048, 128_000).encoder_budget, 7 * 16_384);
        // the profile's peak holds the kept features beside the forward or the sampler
        assert!(s.activation_bytes > s.encoder_kept_bytes);
        // a text model has none
        assert_eq!(serve(&arch("llama3.1-8b"), 2048, 4096).encoder_items, 0);
    }

    /// Qwen3-VL's profile (vLLM 0.11.0, `Qwen3VLProcessingInfo`): a dummy video, its every
    /// token booked as 12.5; from max_model_len 16,200 on 24,576 frames of 32 x 32 (12,288
    /// tokens, 49,152 patches), below it 2 frames of 3,520 x 3,520 (12,100 tokens); one item
    /// whose features, the main merger's and the three deepstack mergers', are padded to
    /// the whole budget; the deepstack buffer of a step's tokens loads with the model.
    #[cfg(feature = "vision")]
    #[test]
    fn qwen3_vl_is_profiled_with_vllm_s_dummy_video() {
        let h100 = crate::Gpu::H100_80.serve_device(None).unwrap();
        let arch = vlm(
            include_str!("../../validation/configs/qwen3-vl-4b-4l.json"),
            &[],
        );
        let vl = arch.vlm.as_deref().unwrap();
        let width = vl.lm_hidden * 4;
        assert_eq!(vl.deepstack, 3);
        let serve = |len, batched| {
            let settings = VllmSettings {
                max_model_len: Some(len),
                max_num_batched_tokens: Some(batched),
                ..VllmSettings::default()
            };
            serve_vllm(&arch, h100, &settings).expect("serves")
        };
        for (len, tokens) in [
            (32_768, 12_288),
            (16_200, 12_288),
            (16_199, 12_100),
            (8192, 12_100),
        ] {
            let s = serve(len, 8192);
            let booked = tokens * 25 / 2;
            assert_eq!((s.encoder_items, s.encoder_budget), (1, booked), "{len}");
            assert_eq!(s.encoder_kept_bytes, booked * width * 2, "{len}");
        }
        // the deepstack buffer: 3 x a step's tokens x the hidden width, in bf16
        let (small, large) = (serve(32_768, 2048), serve(32_768, 8192));
        assert_eq!(
            large.weights_bytes - small.weights_bytes,
            3 * 6144 * vl.lm_hidden * 2
        );
    }

    #[cfg(feature = "vision")]
    #[test]
    fn llama_3_2_vision_which_vllm_0_11_does_not_serve_is_refused_by_name() {
        let h100 = crate::Gpu::H100_80.serve_device(None).unwrap();
        let arch = vlm(
            include_str!("../../validation/configs/llama3.2-11b-vision-5l.json"),
            &[],
        );
        let (field, why) = serve_vllm(&arch, h100, &VllmSettings::default()).unwrap_err();
        assert_eq!(field, Field::Model);
        assert!(why.contains("Mllama"), "{why}");
    }

    #[test]
    fn torch_s_tensor_parallel_communicator_is_nccl_s_rings() {
        let mib = |gpu: crate::Gpu, tp| {
            gpu.serve_device(None)
                .expect("a CUDA GPU")
                .tp_communicator_bytes(tp)
                >> 20
        };
        use crate::Gpu::{L40s, Mi300x, A100_80, B200, H100_80};
        // 24 channels of a 10 + 2 MiB ring connection, 3 pages for each of 32, 2 more
        assert_eq!(mib(H100_80, 2), 24 * 12 + (3 * 32 + 2) * 2);
        // NVLink SHARP past two ranks: a page per channel and one
        assert_eq!(mib(H100_80, 4), 484 + 25 * 2);
        assert_eq!(mib(H100_80, 8), mib(H100_80, 4));
        assert_eq!(mib(A100_80, 8), 484);
        assert_eq!(mib(B200, 8), 32 * 12 + (3 * 32 + 2) * 2 + 33 * 2);
        // PCIe: two channels
        assert_eq!(mib(L40s, 4), 2 * 12 + (3 * 2 + 2) * 2);
        assert_eq!(mib(H100_80, 1), 0);
        assert_eq!(mib(Mi300x, 8), 0);
    }

    #[test]
    fn expert_parallelism_holds_whole_experts_and_runs_them_whole() {
        let rank = |key: &str, tp, ep| served::rank_weights(&arch(key), tp, ep);
        // 128 experts over 2 ranks: whole experts or halves of each, the same bytes
        assert_eq!(
            rank("qwen3-30b-a3b", 2, true),
            rank("qwen3-30b-a3b", 2, false)
        );
        // 60 experts over 8 ranks: the first ranks hold 8 whole experts, not 7.5
        let (whole, split) = (
            rank("qwen1.5-moe-a2.7b", 8, true),
            rank("qwen1.5-moe-a2.7b", 8, false),
        );
        assert_eq!(whole.experts * 60, split.experts * 64);
        assert_eq!(
            (whole.linear, whole.sixteen_bit),
            (split.linear, split.sixteen_bit)
        );
        // a rank runs its experts on every token at their whole inner width
        let forward =
            |ep| served::forward_peak_bytes(&arch("qwen3-30b-a3b"), 2, ep, 16_384, 256, 32_768, 16);
        assert!(forward(true) > forward(false));
        // a dense model ignores the flag
        let settings = |ep| VllmSettings {
            tensor_parallel: 2,
            expert_parallel: ep,
            ..VllmSettings::default()
        };
        let device = crate::Gpu::H100_80.serve_device(None).unwrap();
        let llama = arch("llama3.1-8b");
        assert_eq!(
            serve_vllm(&llama, device, &settings(true)),
            serve_vllm(&llama, device, &settings(false))
        );
        // gpt-oss's MXFP4 experts on Hopper (inner width padded to 64): split over two ranks,
        // each half of 2,880 is padded from 1,440 to 1,472; whole, 2,880 needs no padding
        let oss = arch("gpt-oss-120b");
        let mxfp4 = |ep| VllmSettings {
            weight_format: WeightFormat::Mxfp4,
            ..settings(ep)
        };
        let (on, off) = (
            serve_vllm(&oss, device, &mxfp4(true)).unwrap(),
            serve_vllm(&oss, device, &mxfp4(false)).unwrap(),
        );
        // per layer: 128 x [2,944 + 2,880] x 2,880 against 64 x [5,760 + 2,880] x 2,880 weights
        // at 17/32 of a byte (4 bits and a scale per 32), and their 16-bit biases
        let weights = 3 * 2880 * (128 * 1472 - 64 * 2880) * 17 / 32;
        let biases = 2 * (128 * (2 * 1472 + 2880) - 64 * (2 * 2880 + 2880));
        assert_eq!(
            off.weights_bytes - on.weights_bytes,
            36 * (weights + biases)
        );
    }

    #[test]
    fn pages_groups_and_blocks_match_vllm_logs() {
        // (validation/published/vllm-logs.tsv: id, preset, tp, KV bytes, batched tokens,
        // available GiB, tokens, max_model_len, concurrency)
        for (id, key, tp, kv, batched, gib, tokens, len, conc) in [
            ("v07", "qwen3-14b", 1, 2, 8192, 6.51, 42_656, 32_768, 1.30),
            ("v14", "qwen3-8b", 1, 2, 2048, 6.37, 46_368, 16_384, 2.83),
            (
                "v08",
                "qwen3-30b-a3b",
                1,
                1,
                8192,
                10.55,
                230_528,
                100_000,
                2.31,
            ),
            ("v61", "qwen3-14b", 1, 2, 2048, 11.57, 75_824, 40_960, 1.85),
            ("v62", "qwen3-14b", 1, 2, 2048, 29.63, 194_192, 40_960, 4.74),
            // one replicated key/value head per rank
            (
                "v39",
                "qwen3-235b-a22b",
                8,
                2,
                2048,
                10.64,
                237_344,
                32_768,
                7.24,
            ),
            // hybrids: 18 sliding + 18 full layers in two groups; gemma 3's 22 sliding and 4
            // full in 6 + 1 groups of 4 (two padding layers)
            (
                "v37",
                "gpt-oss-120b",
                4,
                2,
                2048,
                45.32,
                2_640_144,
                16_384,
                284.25,
            ),
            ("v65", "gemma3-1b", 1, 2, 8192, 25.39, 950_864, 2048, 461.21),
        ] {
            let a = arch(key);
            let p = pool(&a, tp, kv, batched);
            assert_log(id, &p, gib, tokens, len, conc);
        }
        // v13 printed tokens alone: every gpt-oss layer priced as full attention
        let p = pool(&arch("gpt-oss-120b"), 1, 2, 8192);
        assert_eq!(p.layers_per_group, 18);
        assert_eq!(p.groups.len(), 2);
        assert_eq!(p.bytes_per_token, 36 * 2048);
    }

    fn qwen3_next() -> Architecture {
        crate::parse_hf_config(include_str!(
            "../tests/fixtures/configs/qwen3-next-80b-a3b-instruct.json"
        ))
        .expect("parses")
    }

    /// Qwen3-Next's pool as vLLM 0.11.0 lays it out (`verify_and_update_config`,
    /// `_get_kv_cache_groups_uniform_page_size`): a Gated DeltaNet layer's state (its
    /// convolution's 3 x 8,192 channels and 32 x 128 x 128, in bf16, split by TP) raises the
    /// attention block to hold it in multiples of 16 tokens, and its page is padded to the
    /// attention page; 12 full-attention and 36 state layers make 1 + 3 groups of 12.
    #[test]
    fn a_hybrid_s_states_share_the_pool_as_vllm_groups_them() {
        let next = qwen3_next();
        // (tp, KV bytes, block, page): the block and page vLLM's formula gives for each
        for (tp, kv, block, page) in [
            (1, 2, 544, 1_114_112),
            (2, 2, 544, 557_056),
            (4, 2, 272, 278_528),
            (8, 2, 144, 147_456),
            (1, 1, 1072, 1_097_728),
        ] {
            let layers = served::kv_layers(&next, tp);
            let state = layers.iter().map(|l| l.state_bytes).max().unwrap();
            assert_eq!(state, 2 * (3 * 8192 + 32 * 128 * 128) / tp, "tp {tp}");
            let p = pool(&next, tp, kv, 8192);
            assert_eq!((p.block_size, p.page), (block, page), "tp {tp}, kv {kv}");
            assert_eq!((p.groups.len(), p.layers_per_group), (4, 12));
        }
        // v71, 2 x H200, TP 2 (v0.10.2, the same arithmetic): "Current kv cache memory in use
        // is 47878721024 bytes", "num_gpu_blocks is: 7162", "GPU KV cache size: 973,760
        // tokens", "Maximum concurrency for 262,144 tokens per request: 14.77x"
        let p = pool(&next, 2, 2, 8192);
        let blocks = p.blocks(47_878_721_024);
        assert_eq!(blocks, 7162);
        assert_eq!(p.tokens(blocks), 973_760);
        let c = p.concurrency(blocks, 262_144);
        assert_eq!(
            (c.blocks_per_request, c.to_string()),
            (482 + 3, "14.77x".to_owned())
        );
        // one request needs every attention layer's pages and every state layer's one page
        assert_eq!(p.needed(262_144), (12 * 482 + 36) * 557_056);
    }

    /// A Qwen3-Next config with dimensions as large as the reader takes (its Gated DeltaNet's
    /// bounded so that no size overflows), on every TP and KV dtype: sized or refused with a
    /// field, never a panic (the tests run with overflow checks).
    #[test]
    fn a_hybrid_with_extreme_dimensions_is_sized_or_refused() {
        let text = include_str!("../tests/fixtures/configs/qwen3-next-80b-a3b-instruct.json");
        let (linear, big) = (1u64 << 10, 1u64 << 20);
        let mut sized = 0;
        for (field, value) in [
            ("\"linear_num_key_heads\": 16", linear),
            ("\"linear_num_value_heads\": 32", linear),
            ("\"linear_key_head_dim\": 128", linear),
            ("\"linear_value_head_dim\": 128", linear),
            ("\"linear_conv_kernel_dim\": 4", 64),
            ("\"hidden_size\": 2048", big),
        ] {
            let name = field.split(':').next().unwrap();
            let config = text.replace(field, &format!("{name}: {value}"));
            let Ok(arch) = crate::parse_hf_config(&config) else {
                continue;
            };
            for tp in [1, 2, 4, 8, 16] {
                for kv_dtype in [KvDtype::Model, KvDtype::Fp8] {
                    let settings = VllmSettings {
                        tensor_parallel: tp,
                        kv_dtype,
                        ..VllmSettings::default()
                    };
                    let h100 = crate::Gpu::H100_80.serve_device(None).unwrap();
                    if let Ok(s) = serve_vllm(&arch, h100, &settings) {
                        assert!(s.block_size >= 16 && s.block_size % 16 == 0, "{field}");
                        sized += 1;
                    }
                }
            }
        }
        assert!(sized > 0);
    }

    /// vLLM's start-up of Qwen3-Next on 2 x H200 as v71 logged it: the weights to the
    /// hundredth of a GiB, the KV tokens and concurrency within 2%; training is refused.
    #[test]
    fn qwen3_next_serves_as_vllm_logged_it() {
        let h200 = crate::Gpu::H200.serve_device(None).unwrap();
        let settings = VllmSettings {
            tensor_parallel: 2,
            ..VllmSettings::default()
        };
        let s = serve_vllm(&qwen3_next(), h200, &settings).expect("serves");
        assert_eq!(vllm_gib(s.weights_bytes), "74.28");
        assert_eq!(
            (s.block_size, s.kv_groups, s.max_model_len),
            (544, 4, 262_144)
        );
        let near = |ours: f64, logged: f64| (ours / logged - 1.0).abs() < 0.02;
        assert!(
            near(s.kv_cache_tokens as f64, 973_760.0),
            "{}",
            s.kv_cache_tokens
        );
        assert!(
            near(s.max_concurrency.as_f64(), 14.77),
            "{}",
            s.max_concurrency
        );
        // three in four layers keep a state, not keys and values: 12 layers' bytes per token
        assert_eq!(s.kv_bytes_per_token, 12 * 2 * 256 * 2);
        let odd = VllmSettings {
            tensor_parallel: 3,
            ..settings
        };
        assert_eq!(
            serve_vllm(&qwen3_next(), h200, &odd).unwrap_err().0,
            Field::TensorParallel
        );
    }

    #[test]
    fn bytes_per_token_per_family() {
        // (preset, TP, KV elements per token per layer on a rank, layers)
        for (key, tp, per_layer, layers) in [
            // GQA: K and V of the rank's key/value heads
            ("llama3.1-8b", 1, 2 * 8 * 128, 32),
            ("llama3.1-8b", 2, 2 * 4 * 128, 32),
            // more ranks than key/value heads: one head each, replicated
            ("llama3.1-8b", 16, 2 * 128, 32),
            ("qwen3-235b-a22b", 8, 2 * 128, 94),
            // MLA: the compressed latent and the rope key, whole on every rank
            ("deepseek-v3", 1, 512 + 64, 61),
            ("deepseek-v3", 8, 512 + 64, 61),
            // gpt-oss: every layer's cache, sliding or not, has the same page
            ("gpt-oss-120b", 4, 2 * 2 * 64, 36),
        ] {
            let a = arch(key);
            let kv = served::kv_layers(&a, tp);
            assert_eq!(kv.len(), layers, "{key}");
            assert!(
                kv.iter().all(|l| l.elements_per_token == per_layer),
                "{key} on {tp}"
            );
        }
        // MLA pages 64 tokens on Hopper (FlashMLA), 128 on Blackwell (CUTLASS MLA)
        let on = |gpu: crate::Gpu| {
            serve_vllm(
                &arch("deepseek-v3"),
                gpu.serve_device(None).expect("a GPU"),
                &VllmSettings {
                    tensor_parallel: 8,
                    weight_format: WeightFormat::Fp8,
                    max_model_len: Some(8192),
                    ..VllmSettings::default()
                },
            )
            .expect("serves")
        };
        assert_eq!(on(crate::Gpu::H200).block_size, 64);
        assert_eq!(on(crate::Gpu::B200).block_size, 128);
        assert_eq!(on(crate::Gpu::H200).kv_bytes_per_token, 61 * 576 * 2);
    }

    /// EXAONE 4.0 32B, three 4,096-token windows to one global layer: vLLM gives the window
    /// layers `SlidingWindowSpec`s, 16 full and 48 sliding layers make 1 + 3 groups of 16, and
    /// a request of the model's 131,072 tokens pays full length in one group only.
    #[test]
    fn exaone4_s_sliding_layers_pool_as_vllm_groups_them() {
        let exaone =
            crate::parse_hf_config(include_str!("../tests/fixtures/configs/exaone4-32b.json"))
                .expect("parses");
        let layers = served::kv_layers(&exaone, 2);
        let sliding = layers.iter().filter(|l| l.window == Some(4096)).count();
        assert_eq!((layers.len(), sliding), (64, 48));
        let p = pool(&exaone, 2, 2, 8192);
        assert_eq!((p.groups.len(), p.layers_per_group), (4, 16));
        // a window keeps its last 4,095 tokens and the step's 8,192: 769 blocks of 16
        let c = p.concurrency(10_000, 131_072);
        assert_eq!(c.blocks_per_request, 8192 + 3 * 769);
    }

    /// Every preset on every GPU, TP size, KV dtype and format: vLLM's start-up is sized or
    /// refused with a field, never a panic, and its figures hold together.
    #[test]
    fn every_preset_gpu_and_setting_holds_together() {
        for preset in Preset::ALL {
            let a = preset.architecture().expect("parses");
            for gpu in crate::Gpu::ALL {
                let Some(device) = gpu.serve_device(Some(40_000)) else {
                    continue;
                };
                for (tp, kv_dtype, weight_format) in [
                    (1, KvDtype::Model, WeightFormat::Recipe),
                    (2, KvDtype::Fp8, WeightFormat::Fp8),
                    (4, KvDtype::Model, WeightFormat::Int4Group128),
                    (8, KvDtype::Fp8, WeightFormat::Mxfp4),
                    (3, KvDtype::Q4_0, WeightFormat::Q4KM),
                ] {
                    let settings = VllmSettings {
                        tensor_parallel: tp,
                        kv_dtype,
                        weight_format,
                        max_model_len: Some(4096),
                        ..VllmSettings::default()
                    };
                    let Ok(s) = serve_vllm(&a, device, &settings) else {
                        continue;
                    };
                    let at = format!("{} on {} x{tp}", preset.key(), gpu.key());
                    let available = u64::try_from(s.available_kv_bytes).unwrap_or(0);
                    assert!(s.kv_cache_bytes <= available, "{at}");
                    assert_eq!(s.kv_cache_tokens % s.block_size, 0, "{at}");
                    assert_eq!(
                        s.available_kv_bytes,
                        i64::try_from(s.requested_bytes).unwrap()
                            - i64::try_from(
                                s.weights_bytes + s.activation_bytes + s.non_torch_bytes
                            )
                            .unwrap(),
                        "{at}"
                    );
                    // the longest request fits, one page more does not (below the context)
                    assert_eq!(
                        s.max_model_len_fits,
                        s.largest_max_model_len >= 4096,
                        "{at}"
                    );
                    assert_eq!(
                        s.headroom_bytes + s.requested_bytes,
                        s.device_total_bytes,
                        "{at}"
                    );
                    assert!(s.sweep.iter().any(|r| r.max_model_len == 4096), "{at}");
                    let _ = serve_advice(&a, device, &settings, &s);
                }
            }
        }
    }

    #[test]
    fn one_request_needs_each_layer_s_pages() {
        let p = pool(&arch("gemma3-1b"), 1, 2, 8192);
        // 4 full layers of cdiv(len, 16) pages, 22 sliding ones of the window and the step's
        // new tokens, plus one page
        let needed = |len: u64| {
            (4 * len.div_ceil(16) + 22 * ((511 + 8192).min(len).div_ceil(16) + 1)) * p.page
        };
        for len in [1, 16, 17, 2048, 8703, 8704, 32_768] {
            assert_eq!(p.needed(len), needed(len), "{len}");
        }
        assert_eq!(
            largest_len(32_768, |len| p.needed(len) <= needed(20_000)),
            20_000 / 16 * 16
        );
    }

    #[track_caller]
    fn assert_weights_gib(
        key: &str,
        device: ServeDevice,
        tp: u64,
        format: WeightFormat,
        logged: &str,
    ) {
        let s = serve_vllm(
            &arch(key),
            device,
            &VllmSettings {
                tensor_parallel: tp,
                weight_format: format,
                max_model_len: Some(4096),
                ..VllmSettings::default()
            },
        )
        .expect("serves");
        let gib = s.weights_bytes as f64 / GIB as f64;
        assert_eq!(format!("{gib:.4}"), logged, "{key} on {tp}");
    }

    #[test]
    fn weights_match_model_loading_took() {
        let a100 = crate::Gpu::A100_80.serve_device(None).expect("a GPU");
        // v01: 8.03 B weights and the rotary table of 131,072 positions x 128
        assert_weights_gib("llama3.1-8b", a100, 1, WeightFormat::Recipe, "14.9888");
        // v37: gpt-oss-120b's MXFP4 experts as Marlin pads them, a quarter on each rank
        // (17.2217 logged: 5 MB more, Marlin's repacking)
        assert_weights_gib("gpt-oss-120b", a100, 4, WeightFormat::Recipe, "17.2172");
    }

    #[test]
    fn refusals_name_their_field() {
        let h100 = crate::Gpu::H100_80.serve_device(None).expect("a GPU");
        let run = |key: &str, s: VllmSettings| serve_vllm(&arch(key), h100, &s).err().map(|e| e.0);
        let base = VllmSettings::default();
        assert_eq!(
            run(
                "llama3.1-8b",
                VllmSettings {
                    tensor_parallel: 3,
                    ..base
                }
            ),
            Some(Field::TensorParallel)
        );
        assert_eq!(
            run(
                "llama3.1-8b",
                VllmSettings {
                    kv_dtype: KvDtype::Q4_0,
                    ..base
                }
            ),
            Some(Field::KvDtype)
        );
        assert_eq!(
            run(
                "llama3.1-8b",
                VllmSettings {
                    weight_format: WeightFormat::Q4KM,
                    ..base
                }
            ),
            Some(Field::WeightFormat)
        );
        assert_eq!(
            run(
                "llama3.1-8b",
                VllmSettings {
                    max_model_len: Some(200_000),
                    ..base
                }
            ),
            Some(Field::MaxModelLen)
        );
        assert_eq!(run("llama3.1-8b", base), None);
        assert_eq!(run("bert-base", base), Some(Field::Model));
        assert_eq!(run("vit-b16", base), Some(Field::Model));
    }

    #[test]
    fn more_utilization_more_tokens_and_fp8_halves_the_token_s_bytes() {
        let h100 = crate::Gpu::H100_80.serve_device(None).expect("a GPU");
        let at = |ppm: u32, kv: KvDtype| {
            serve_vllm(
                &arch("llama3.1-8b"),
                h100,
                &VllmSettings {
                    utilization_ppm: ppm,
                    kv_dtype: kv,
                    max_model_len: Some(8192),
                    ..VllmSettings::default()
                },
            )
            .expect("serves")
        };
        let (low, high) = (at(500_000, KvDtype::Model), at(900_000, KvDtype::Model));
        assert!(high.kv_cache_tokens > low.kv_cache_tokens);
        assert_eq!(high.weights_bytes, low.weights_bytes);
        let fp8 = at(900_000, KvDtype::Fp8);
        assert_eq!(fp8.kv_bytes_per_token * 2, high.kv_bytes_per_token);
        assert!(fp8.kv_cache_tokens >= 2 * high.kv_cache_tokens - 16);
        assert_eq!(high.kv_bytes_per_token, 32 * 8 * 128 * 2 * 2);
    }
}
