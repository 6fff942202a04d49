//! Planning for real hardware: GPUs, overheads, the fit verdict, the largest batch that
//! fits, gradient accumulation and sharding across several GPUs.

use std::fmt;

/// Bytes in one MiB (2^20), the unit nvidia-smi reports capacities in.
pub const BYTES_PER_MIB: u64 = 1 << 20;

/// What kind of memory a [`Gpu`] is, and so which overheads apply: only discrete GPUs carry
/// a CUDA context; the allocator reserve and the safety margin apply to every device (on a
/// Mac or a CPU the margin stands for the system and the other programs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceKind {
    /// A discrete GPU (CUDA or ROCm): its own memory, and a context on it.
    Gpu,
    /// Apple silicon: the GPU may wire a share of the unified memory (no CUDA context).
    AppleUnified {
        /// The Mac's memory in GiB (Apple's "16 GB" is 16 GiB, as for all DRAM).
        ram_gib: u64,
    },
    /// The computer's RAM, for running on the CPU (no CUDA context).
    CpuRam,
}

/// The share of a Mac's unified memory the GPU may wire by default, in MiB: macOS's
/// `recommendedMaxWorkingSetSize` (what PyTorch MPS and llama.cpp's Metal backend take as
/// the limit) is about 2/3 of the memory up to 36 GB and 3/4 above. This is observed
/// behaviour reported by llama.cpp and MLX users, not documented by Apple; it can be raised
/// with `sudo sysctl iogpu.wired_limit_mb=...`.
#[must_use]
pub const fn apple_gpu_share_mib(ram_gib: u64) -> u64 {
    let mib = ram_gib.saturating_mul(1024);
    if ram_gib <= 36 {
        mib / 3 * 2 + mib % 3 * 2 / 3
    } else {
        mib / 4 * 3 + mib % 4 * 3 / 4
    }
}

/// A device to fit the step on: a GPU with the total memory nvidia-smi reports for it, a
/// Mac's unified memory, the computer's RAM, or a custom capacity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Gpu {
    /// GeForce RTX 3090, 24 GB.
    Rtx3090,
    /// GeForce RTX 4090, 24 GB.
    Rtx4090,
    /// GeForce RTX 5090, 32 GB.
    Rtx5090,
    /// A10G, 24 GB (AWS g5).
    A10g,
    /// L4, 24 GB.
    L4,
    /// L40S, 48 GB.
    L40s,
    /// T4, 16 GB.
    T4,
    /// V100 16 GB.
    V100_16,
    /// V100 32 GB.
    V100_32,
    /// A100 40 GB.
    A100_40,
    /// A100 80 GB.
    A100_80,
    /// H100 80 GB.
    H100_80,
    /// H200, 141 GB.
    H200,
    /// B200, 180 GB.
    B200,
    /// AMD Instinct MI300X, 192 GB.
    Mi300x,
    /// Apple silicon Mac, 8 GB unified memory.
    Mac8,
    /// Apple silicon Mac, 16 GB unified memory.
    Mac16,
    /// Apple silicon Mac, 18 GB unified memory.
    Mac18,
    /// Apple silicon Mac, 24 GB unified memory.
    Mac24,
    /// Apple silicon Mac, 32 GB unified memory.
    Mac32,
    /// Apple silicon Mac, 36 GB unified memory.
    Mac36,
    /// Apple silicon Mac, 48 GB unified memory.
    Mac48,
    /// Apple silicon Mac, 64 GB unified memory.
    Mac64,
    /// Apple silicon Mac, 96 GB unified memory.
    Mac96,
    /// Apple silicon Mac, 128 GB unified memory.
    Mac128,
    /// Apple silicon Mac, 192 GB unified memory.
    Mac192,
    /// The computer's RAM (running on the CPU), its capacity typed in GiB.
    CpuRam,
    /// A capacity typed in by the person.
    Custom,
}

impl Gpu {
    /// Every device, in the order the page lists them.
    pub const ALL: [Gpu; 28] = [
        Gpu::Rtx3090,
        Gpu::Rtx4090,
        Gpu::Rtx5090,
        Gpu::A10g,
        Gpu::L4,
        Gpu::L40s,
        Gpu::T4,
        Gpu::V100_16,
        Gpu::V100_32,
        Gpu::A100_40,
        Gpu::A100_80,
        Gpu::H100_80,
        Gpu::H200,
        Gpu::B200,
        Gpu::Mi300x,
        Gpu::Mac8,
        Gpu::Mac16,
        Gpu::Mac18,
        Gpu::Mac24,
        Gpu::Mac32,
        Gpu::Mac36,
        Gpu::Mac48,
        Gpu::Mac64,
        Gpu::Mac96,
        Gpu::Mac128,
        Gpu::Mac192,
        Gpu::CpuRam,
        Gpu::Custom,
    ];

    /// What kind of memory it is.
    #[must_use]
    pub const fn kind(self) -> DeviceKind {
        let ram_gib = match self {
            Gpu::Mac8 => 8,
            Gpu::Mac16 => 16,
            Gpu::Mac18 => 18,
            Gpu::Mac24 => 24,
            Gpu::Mac32 => 32,
            Gpu::Mac36 => 36,
            Gpu::Mac48 => 48,
            Gpu::Mac64 => 64,
            Gpu::Mac96 => 96,
            Gpu::Mac128 => 128,
            Gpu::Mac192 => 192,
            Gpu::CpuRam => return DeviceKind::CpuRam,
            _ => return DeviceKind::Gpu,
        };
        DeviceKind::AppleUnified { ram_gib }
    }

    /// Whether a CUDA (or ROCm) context takes memory on it: discrete GPUs only.
    #[must_use]
    pub const fn has_cuda_context(self) -> bool {
        matches!(self.kind(), DeviceKind::Gpu)
    }

    /// Whether it computes in bf16 (V100 and T4 predate it: fp16 recipes there).
    #[must_use]
    pub const fn supports_bf16(self) -> bool {
        !matches!(self, Gpu::T4 | Gpu::V100_16 | Gpu::V100_32)
    }

    /// Total memory as nvidia-smi (or rocm-smi) reports it, in MiB; for a Mac the share its
    /// GPU may use ([`apple_gpu_share_mib`]); `None` for a capacity typed in (custom GPU,
    /// CPU RAM).
    #[must_use]
    pub const fn capacity_mib(self) -> Option<u64> {
        if let DeviceKind::AppleUnified { ram_gib } = self.kind() {
            return Some(apple_gpu_share_mib(ram_gib));
        }
        Some(match self {
            Gpu::Rtx3090 => 24_576,
            Gpu::Rtx4090 => 24_564,
            Gpu::Rtx5090 => 32_607,
            Gpu::A10g => 23_028,
            Gpu::L4 => 23_034,
            Gpu::L40s => 46_068,
            Gpu::T4 => 15_360,
            Gpu::V100_16 => 16_160,
            Gpu::V100_32 => 32_510,
            Gpu::A100_40 => 40_960,
            Gpu::A100_80 => 81_920,
            Gpu::H100_80 => 81_559,
            Gpu::H200 => 143_771,
            Gpu::B200 => 183_359,
            Gpu::Mi300x => 196_288,
            _ => return None,
        })
    }

    /// Total memory as the driver reports it to PyTorch (`torch.cuda.mem_get_info()[1]`),
    /// in MiB: below nvidia-smi's figure ([`Gpu::capacity_mib`]) by what the driver keeps.
    /// Quoted per GPU in `validation/published/gpu-totals.tsv`; `None` for Macs, the CPU and a
    /// custom GPU.
    #[must_use]
    pub const fn driver_total_mib(self) -> Option<u64> {
        Some(match self {
            Gpu::Rtx3090 => 24_146,
            Gpu::Rtx4090 => 24_207,
            Gpu::Rtx5090 => 32_113,
            Gpu::A10g => 22_587,
            Gpu::L4 => 22_559,
            Gpu::L40s => 45_455,
            Gpu::T4 => 15_104,
            Gpu::V100_16 => 16_160,
            Gpu::V100_32 => 32_510,
            Gpu::A100_40 => 40_509,
            Gpu::A100_80 => 81_049,
            Gpu::H100_80 => 81_090,
            Gpu::H200 => 143_156,
            Gpu::B200 => 182_631,
            Gpu::Mi300x => 196_592,
            _ => return None,
        })
    }

    /// The device as vLLM's worker sees it; `custom_mib` is a custom GPU's capacity (taken as
    /// the driver's total). `None` for a Mac or the CPU.
    #[must_use]
    pub const fn serve_device(self, custom_mib: Option<u64>) -> Option<crate::ServeDevice> {
        let mib = match (self, self.driver_total_mib(), custom_mib) {
            (_, Some(mib), _) | (Gpu::Custom, None, Some(mib)) => mib,
            _ => return None,
        };
        let total_bytes = mib * BYTES_PER_MIB;
        Some(crate::ServeDevice {
            total_bytes,
            // the scheduler's "large GPU": 70 GiB or more, A100s excepted (vLLM PR #17885)
            large: total_bytes >= 70 << 30 && !matches!(self, Gpu::A100_80 | Gpu::A100_40),
            compute_capability: match self {
                Gpu::V100_16 | Gpu::V100_32 => 70,
                Gpu::T4 => 75,
                Gpu::A100_40 | Gpu::A100_80 => 80,
                Gpu::Rtx3090 | Gpu::A10g => 86,
                Gpu::Rtx4090 | Gpu::L4 | Gpu::L40s => 89,
                Gpu::H100_80 | Gpu::H200 | Gpu::Custom => 90,
                Gpu::B200 => 100,
                Gpu::Rtx5090 => 120,
                _ => 0,
            },
            rocm: matches!(self, Gpu::Mi300x),
            // (the SXM boards of the servers these GPUs come in; a PCIe H100 or A100 is the
            // custom GPU's case)
            nvswitch: matches!(
                self,
                Gpu::A100_40 | Gpu::A100_80 | Gpu::H100_80 | Gpu::H200 | Gpu::B200
            ),
        })
    }

    /// Short stable key used in URLs and the CLI.
    #[must_use]
    pub const fn key(self) -> &'static str {
        match self {
            Gpu::Rtx3090 => "rtx3090",
            Gpu::Rtx4090 => "rtx4090",
            Gpu::Rtx5090 => "rtx5090",
            Gpu::A10g => "a10g",
            Gpu::L4 => "l4",
            Gpu::L40s => "l40s",
            Gpu::T4 => "t4",
            Gpu::V100_16 => "v100-16",
            Gpu::V100_32 => "v100-32",
            Gpu::A100_40 => "a100-40",
            Gpu::A100_80 => "a100-80",
            Gpu::H100_80 => "h100-80",
            Gpu::H200 => "h200",
            Gpu::B200 => "b200",
            Gpu::Mi300x => "mi300x",
            Gpu::Mac8 => "mac-8",
            Gpu::Mac16 => "mac-16",
            Gpu::Mac18 => "mac-18",
            Gpu::Mac24 => "mac-24",
            Gpu::Mac32 => "mac-32",
            Gpu::Mac36 => "mac-36",
            Gpu::Mac48 => "mac-48",
            Gpu::Mac64 => "mac-64",
            Gpu::Mac96 => "mac-96",
            Gpu::Mac128 => "mac-128",
            Gpu::Mac192 => "mac-192",
            Gpu::CpuRam => "cpu",
            Gpu::Custom => "custom",
        }
    }

    /// Name shown to a person.
    #[must_use]
    pub const fn label(self) -> &'static str {
        match self {
            Gpu::Rtx3090 => "RTX 3090 (24,576 MiB)",
            Gpu::Rtx4090 => "RTX 4090 (24,564 MiB)",
            Gpu::Rtx5090 => "RTX 5090 (32,607 MiB)",
            Gpu::A10g => "A10G (23,028 MiB)",
            Gpu::L4 => "L4 (23,034 MiB)",
            Gpu::L40s => "L40S (46,068 MiB)",
            Gpu::T4 => "T4 (15,360 MiB)",
            Gpu::V100_16 => "V100 16 GB (16,160 MiB)",
            Gpu::V100_32 => "V100 32 GB (32,510 MiB)",
            Gpu::A100_40 => "A100 40 GB (40,960 MiB)",
            Gpu::A100_80 => "A100 80 GB (81,920 MiB)",
            Gpu::H100_80 => "H100 80 GB (81,559 MiB)",
            Gpu::H200 => "H200 (143,771 MiB)",
            Gpu::B200 => "B200 (183,359 MiB)",
            Gpu::Mi300x => "MI300X (196,288 MiB)",
            Gpu::Mac8 => "Mac, 8 GB unified memory (GPU share 5,461 MiB)",
            Gpu::Mac16 => "Mac, 16 GB unified memory (GPU share 10,922 MiB)",
            Gpu::Mac18 => "Mac, 18 GB unified memory (GPU share 12,288 MiB)",
            Gpu::Mac24 => "Mac, 24 GB unified memory (GPU share 16,384 MiB)",
            Gpu::Mac32 => "Mac, 32 GB unified memory (GPU share 21,845 MiB)",
            Gpu::Mac36 => "Mac, 36 GB unified memory (GPU share 24,576 MiB)",
            Gpu::Mac48 => "Mac, 48 GB unified memory (GPU share 36,864 MiB)",
            Gpu::Mac64 => "Mac, 64 GB unified memory (GPU share 49,152 MiB)",
            Gpu::Mac96 => "Mac, 96 GB unified memory (GPU share 73,728 MiB)",
            Gpu::Mac128 => "Mac, 128 GB unified memory (GPU share 98,304 MiB)",
            Gpu::Mac192 => "Mac, 192 GB unified memory (GPU share 147,456 MiB)",
            Gpu::CpuRam => "CPU RAM (capacity in GiB)",
            Gpu::Custom => "Custom capacity",
        }
    }

    /// Its name without the capacity: "RTX 4090".
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Gpu::Custom => "GPU",
            _ => self.label().split(" (").next().unwrap_or_default(),
        }
    }

    /// The GPU whose [`key`](Self::key) is `key`.
    #[must_use]
    pub fn from_key(key: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|g| g.key() == key)
    }
}

/// The allocator's reserve where no replay is possible (the simple mode, devices without
/// CUDA's allocator): 5% of the peak.
pub const DEFAULT_RESERVE_PPM: u64 = 50_000;

/// The default safety margin, in percent of the capacity. What it still has to cover once
/// the allocator's reserve is replayed and the CUDA context counted: cuBLAS / cuBLASLt
/// workspaces (PyTorch takes them through the caching allocator: 32 MiB per handle and
/// stream on Hopper, about 8 MiB before it, one handle per thread: the forward's and
/// autograd's), the CUDA context's variation by driver and GPU, a display or another
/// process on the same GPU, and what the one-stream replay cannot foresee. A few hundred MiB
/// to a couple of GB: 5%. It was 15% while the reserve was a flat 5% of the peak; kept
/// there, it made "fits" answer 17-28% shorter contexts than published runs that fitted.
pub const DEFAULT_SAFETY_MARGIN_PERCENT: u64 = 5;
/// Parts per million in one percent.
pub const PPM_PER_PERCENT: u64 = 10_000;

/// What the GPU needs beyond the tensors PyTorch counts, and how much to hold back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Overheads {
    /// The CUDA context and kernels loaded on the device.
    pub cuda_context_bytes: u64,
    /// What the caching allocator reserves beyond live tensors, in parts per million of the
    /// peak: a percentage a person typed, or what replaying the step through the allocator
    /// found (`evaluate`).
    pub allocator_reserve_ppm: u64,
    /// Capacity held back for safety, in percent of the GPU's capacity.
    pub safety_margin_percent: u64,
    /// NCCL's buffers and communicators, outside PyTorch's allocator (0 on one GPU).
    pub communication_bytes: u64,
    /// Of the peak, what the allocator's reserve leaves out: memory held whole for the
    /// step, which the caching allocator neither rounds nor fragments (colocated vLLM's
    /// reservation, sized up front; a paged optimizer's state in CUDA managed memory).
    /// Set by `evaluate` from the step (the same at every batch).
    pub outside_allocator_bytes: u64,
}

impl Default for Overheads {
    fn default() -> Self {
        Self {
            cuda_context_bytes: 500 * BYTES_PER_MIB,
            allocator_reserve_ppm: DEFAULT_RESERVE_PPM,
            safety_margin_percent: DEFAULT_SAFETY_MARGIN_PERCENT,
            communication_bytes: 0,
            outside_allocator_bytes: 0,
        }
    }
}

/// The default GPU memory of one NCCL communicator, in MiB: NCCL's documented defaults,
/// `NCCL_BUFFSIZE` 4 MiB per channel and peer, up to 32 channels on NVLink GPUs
/// (`NCCL_MAX_NCHANNELS`), a send and a receive peer in a ring, for two algorithms
/// (ring and tree): 4 x 32 x 2 x 2. An upper estimate for one communicator per parallel
/// dimension; NVLink SHARP (NVLS) buffers on H100/H200/B200 can add more. Editable.
pub const NCCL_MIB_PER_COMMUNICATOR: u64 = 512;

/// FSDP2's `reshard_after_forward`: what each layer keeps gathered from its forward to its
/// backward.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Reshard {
    /// `True`: nothing; each layer is gathered again for its backward.
    #[default]
    On,
    /// `False`: the whole layer, gathered (no all-gather in backward).
    Off,
    /// An int: the layer resharded over this many GPUs (within a node), gathered from
    /// them for its backward.
    To(u64),
}

impl Reshard {
    /// The choices the page lists.
    pub const PAGE: [Reshard; 5] = [
        Reshard::On,
        Reshard::Off,
        Reshard::To(2),
        Reshard::To(4),
        Reshard::To(8),
    ];

    /// Of a model's `layers` (elements or bytes), what stays gathered from the layers'
    /// forward to their backward: nothing, all of it, or its share of the smaller group.
    #[must_use]
    pub(crate) const fn kept(self, layers: u64) -> u64 {
        match self {
            Reshard::On => 0,
            Reshard::Off => layers,
            Reshard::To(r) => layers.div_ceil(if r == 0 { 1 } else { r }),
        }
    }

    /// Short stable key used in URLs and the CLI: `on`, `off` or the number of GPUs.
    #[must_use]
    pub fn key(self) -> String {
        match self {
            Reshard::On => "on".to_owned(),
            Reshard::Off => "off".to_owned(),
            Reshard::To(n) => n.to_string(),
        }
    }

    /// Name shown to a person.
    #[must_use]
    pub fn label(self) -> String {
        match self {
            Reshard::On => "On".to_owned(),
            Reshard::Off => "Off (kept gathered)".to_owned(),
            Reshard::To(n) => format!("To {n} GPUs"),
        }
    }

    /// The choice a key names: `on`, `off`, or a number of GPUs of at least 2.
    #[must_use]
    pub fn from_key(key: &str) -> Option<Self> {
        match key {
            "on" => Some(Reshard::On),
            "off" => Some(Reshard::Off),
            n => match crate::number::parse_u64(n) {
                Some(n) if (2..=1024).contains(&n) && n.to_string() == key => Some(Reshard::To(n)),
                _ => None,
            },
        }
    }
}

/// torchao's float8 training (`convert_to_float8_training` on every linear but the head,
/// as torchtitan converts a model). Measured on the fake mode (`validation/FLOAT8.md`): the
/// step saves what bf16 saves (the bf16 input and the weight) and adds no state; the casts
/// are transients inside each linear, and FSDP2 can gather its float8 weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Float8 {
    /// bf16 matmuls.
    #[default]
    Off,
    /// One scale per tensor (`Float8LinearConfig()`).
    Tensorwise,
    /// One scale per row (`Float8LinearConfig.from_recipe_name("rowwise")`).
    Rowwise,
}

impl Float8 {
    /// Every recipe, in the order the page lists them.
    pub const ALL: [Float8; 3] = [Float8::Off, Float8::Tensorwise, Float8::Rowwise];

    /// Short stable key used in URLs and the CLI.
    #[must_use]
    pub const fn key(self) -> &'static str {
        match self {
            Float8::Off => "off",
            Float8::Tensorwise => "tensorwise",
            Float8::Rowwise => "rowwise",
        }
    }

    /// Name shown to a person.
    #[must_use]
    pub const fn label(self) -> &'static str {
        match self {
            Float8::Off => "Off (bf16 matmuls)",
            Float8::Tensorwise => "torchao float8, tensorwise scaling",
            Float8::Rowwise => "torchao float8, rowwise scaling",
        }
    }
}

/// FSDP1's `ShardingStrategy` (`FullyShardedDataParallel`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Fsdp1Sharding {
    /// `FULL_SHARD`: parameters, gradients and optimizer states sharded; each unit gathered
    /// while it runs, again for its backward.
    #[default]
    Full,
    /// `SHARD_GRAD_OP`: the same shards, each unit kept gathered from its forward to its
    /// backward.
    GradOp,
    /// `HYBRID_SHARD`: `FULL_SHARD` within a node, replicated across nodes.
    Hybrid,
    /// `NO_SHARD`: every GPU holds everything (DDP through FSDP's flat parameters).
    NoShard,
}

impl Fsdp1Sharding {
    /// Every strategy, in the order the page lists them.
    pub const ALL: [Fsdp1Sharding; 4] = [
        Fsdp1Sharding::Full,
        Fsdp1Sharding::GradOp,
        Fsdp1Sharding::Hybrid,
        Fsdp1Sharding::NoShard,
    ];

    /// Short stable key used in URLs and the CLI.
    #[must_use]
    pub const fn key(self) -> &'static str {
        match self {
            Fsdp1Sharding::Full => "full",
            Fsdp1Sharding::GradOp => "grad-op",
            Fsdp1Sharding::Hybrid => "hybrid",
            Fsdp1Sharding::NoShard => "no-shard",
        }
    }

    /// Name shown to a person.
    #[must_use]
    pub const fn label(self) -> &'static str {
        match self {
            Fsdp1Sharding::Full => "FULL_SHARD",
            Fsdp1Sharding::GradOp => "SHARD_GRAD_OP (kept gathered to backward)",
            Fsdp1Sharding::Hybrid => "HYBRID_SHARD (sharded within a node)",
            Fsdp1Sharding::NoShard => "NO_SHARD (every GPU holds everything)",
        }
    }
}

/// How FSDP1's units are formed (accelerate's `fsdp_auto_wrap_policy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Fsdp1Wrap {
    /// `NO_WRAP` (accelerate's default): the whole model one unit, one flat parameter.
    #[default]
    None,
    /// `TRANSFORMER_BASED_WRAP`: each decoder layer a unit, the rest the root's.
    Layers,
}

impl Fsdp1Wrap {
    /// Every policy, in the order the page lists them.
    pub const ALL: [Fsdp1Wrap; 2] = [Fsdp1Wrap::None, Fsdp1Wrap::Layers];

    /// Short stable key used in URLs and the CLI.
    #[must_use]
    pub const fn key(self) -> &'static str {
        match self {
            Fsdp1Wrap::None => "none",
            Fsdp1Wrap::Layers => "layers",
        }
    }

    /// Name shown to a person.
    #[must_use]
    pub const fn label(self) -> &'static str {
        match self {
            Fsdp1Wrap::None => "NO_WRAP: the whole model one unit (accelerate's default)",
            Fsdp1Wrap::Layers => "TRANSFORMER_BASED_WRAP: a unit per layer",
        }
    }
}

/// FSDP1's `backward_prefetch`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum BackwardPrefetch {
    /// `None` (accelerate's default): the next unit gathered when its backward starts.
    #[default]
    None,
    /// `BACKWARD_PRE`: the next unit's all-gather issued before this one's gradients are
    /// computed.
    Pre,
    /// `BACKWARD_POST`: issued after them.
    Post,
}

impl BackwardPrefetch {
    /// Every choice, in the order the page lists them.
    pub const ALL: [BackwardPrefetch; 3] = [
        BackwardPrefetch::None,
        BackwardPrefetch::Pre,
        BackwardPrefetch::Post,
    ];

    /// Short stable key used in URLs and the CLI.
    #[must_use]
    pub const fn key(self) -> &'static str {
        match self {
            BackwardPrefetch::None => "none",
            BackwardPrefetch::Pre => "pre",
            BackwardPrefetch::Post => "post",
        }
    }

    /// Name shown to a person.
    #[must_use]
    pub const fn label(self) -> &'static str {
        match self {
            BackwardPrefetch::None => "None (accelerate's default)",
            BackwardPrefetch::Pre => "BACKWARD_PRE",
            BackwardPrefetch::Post => "BACKWARD_POST",
        }
    }
}

/// FSDP1 as accelerate wraps a model: its strategy, units and settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Fsdp1 {
    /// `sharding_strategy`.
    pub sharding: Fsdp1Sharding,
    /// `auto_wrap_policy`.
    pub wrap: Fsdp1Wrap,
    /// `use_orig_params` (accelerate's default off; the HF Trainer turns it on).
    pub use_orig_params: bool,
    /// `backward_prefetch`.
    pub backward_prefetch: BackwardPrefetch,
    /// GPUs per node: `HYBRID_SHARD`'s shard group.
    pub gpus_per_node: u64,
}

impl Default for Fsdp1 {
    fn default() -> Self {
        Fsdp1 {
            sharding: Fsdp1Sharding::Full,
            wrap: Fsdp1Wrap::None,
            use_orig_params: false,
            backward_prefetch: BackwardPrefetch::None,
            gpus_per_node: DEFAULT_GPUS_PER_NODE,
        }
    }
}

/// GPUs per node when none is said: an HGX/DGX board's eight.
pub const DEFAULT_GPUS_PER_NODE: u64 = 8;

impl Fsdp1 {
    /// The GPUs each parameter is split over, of `n` data-parallel GPUs.
    #[must_use]
    pub fn shard_group(&self, n: u64) -> u64 {
        let n = n.max(1);
        match self.sharding {
            Fsdp1Sharding::Full | Fsdp1Sharding::GradOp => n,
            Fsdp1Sharding::Hybrid => self.gpus_per_node.clamp(1, n),
            Fsdp1Sharding::NoShard => 1,
        }
    }
}

/// Where ZeRO-Offload (DeepSpeed) or `CPUOffloadPolicy` (FSDP2) keeps state in host RAM.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Offload {
    /// Everything on the GPU.
    #[default]
    None,
    /// The optimizer: fp32 master weights, moments and the gradient partition in host RAM,
    /// stepped by the CPU (DeepSpeed `offload_optimizer`; FSDP2's policy moves the
    /// parameters too).
    Optimizer,
    /// The optimizer and the parameters' shards (DeepSpeed ZeRO-3 `offload_param`; FSDP2
    /// `CPUOffloadPolicy`).
    OptimizerAndParams,
}

impl Offload {
    /// Every choice, in the order the page lists them.
    pub const ALL: [Offload; 3] = [
        Offload::None,
        Offload::Optimizer,
        Offload::OptimizerAndParams,
    ];

    /// Short stable key used in URLs and the CLI.
    #[must_use]
    pub const fn key(self) -> &'static str {
        match self {
            Offload::None => "none",
            Offload::Optimizer => "optimizer",
            Offload::OptimizerAndParams => "optimizer+params",
        }
    }

    /// Name shown to a person.
    #[must_use]
    pub const fn label(self) -> &'static str {
        match self {
            Offload::None => "None",
            Offload::Optimizer => "Optimizer to CPU",
            Offload::OptimizerAndParams => "Optimizer + parameters to CPU",
        }
    }
}

/// The memory a step needs on the device, and what the device offers, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FitVerdict {
    /// The peak of the tensors (what `max_memory_allocated` reports).
    pub peak_bytes: u64,
    /// The allocator's reserve beyond the peak.
    pub allocator_reserve_bytes: u64,
    /// The CUDA context.
    pub cuda_context_bytes: u64,
    /// NCCL's buffers and communicators.
    pub communication_bytes: u64,
    /// Peak + reserve + context + communication.
    pub needed_bytes: u64,
    /// The GPU's capacity.
    pub capacity_bytes: u64,
    /// The part of the capacity held back as a safety margin.
    pub safety_margin_bytes: u64,
    /// Capacity less the safety margin: what `needed_bytes` must stay under.
    pub usable_bytes: u64,
}

impl FitVerdict {
    /// Whether the step fits.
    #[must_use]
    pub const fn fits(&self) -> bool {
        self.needed_bytes <= self.usable_bytes
    }

    /// Bytes left when it fits.
    #[must_use]
    pub const fn bytes_left(&self) -> u64 {
        self.usable_bytes.saturating_sub(self.needed_bytes)
    }

    /// Bytes missing when it does not fit.
    #[must_use]
    pub const fn bytes_missing(&self) -> u64 {
        self.needed_bytes.saturating_sub(self.usable_bytes)
    }
}

/// `a * b / c` (`c` not 0), exactly: in 64 bits when the product fits (WebAssembly has no
/// 128-bit instructions, each operation is a call, and the searches do thousands of these).
pub(crate) fn mul_div(a: u64, b: u64, c: u64) -> u128 {
    if a.leading_zeros() + b.leading_zeros() >= 64 {
        u128::from(a * b / c)
    } else {
        u128::from(a) * u128::from(b) / u128::from(c)
    }
}

pub(crate) fn ppm_of(bytes: u64, ppm: u64) -> u64 {
    u64::try_from(mul_div(bytes, ppm, 1_000_000)).unwrap_or(u64::MAX)
}

fn percent_of(bytes: u64, percent: u64) -> u64 {
    u64::try_from(mul_div(bytes, percent, 100)).unwrap_or(u64::MAX)
}

/// The largest peak that fits on a GPU of `capacity_bytes` with `overheads`: the line
/// drawn on the chart.
#[must_use]
pub fn largest_peak_that_fits(capacity_bytes: u64, overheads: &Overheads) -> u64 {
    let usable = fit_verdict(0, capacity_bytes, overheads)
        .usable_bytes
        .saturating_sub(overheads.cuda_context_bytes)
        .saturating_sub(overheads.communication_bytes);
    // the reserve grows with the rest of the peak only
    let outside = overheads.outside_allocator_bytes.min(usable);
    let rest = u128::from(usable - outside) * 1_000_000
        / (1_000_000 + u128::from(overheads.allocator_reserve_ppm));
    u64::try_from(rest)
        .unwrap_or(u64::MAX)
        .saturating_add(outside)
}

/// Whether a step of `peak_bytes` fits on a GPU of `capacity_bytes` with `overheads`.
#[must_use]
pub fn fit_verdict(peak_bytes: u64, capacity_bytes: u64, overheads: &Overheads) -> FitVerdict {
    let allocator_reserve_bytes = ppm_of(
        peak_bytes.saturating_sub(overheads.outside_allocator_bytes),
        overheads.allocator_reserve_ppm,
    );
    let needed_bytes = peak_bytes
        .saturating_add(allocator_reserve_bytes)
        .saturating_add(overheads.cuda_context_bytes)
        .saturating_add(overheads.communication_bytes);
    let safety_margin_bytes = percent_of(capacity_bytes, overheads.safety_margin_percent.min(100));
    FitVerdict {
        peak_bytes,
        allocator_reserve_bytes,
        cuda_context_bytes: overheads.cuda_context_bytes,
        communication_bytes: overheads.communication_bytes,
        needed_bytes,
        capacity_bytes,
        safety_margin_bytes,
        usable_bytes: capacity_bytes - safety_margin_bytes,
    }
}

/// The largest batch whose peak still fits, or why none does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MaxBatch {
    /// This batch fits and the next one does not (or it is the largest batch allowed).
    Fits(u64),
    /// Even batch 1 does not fit: its verdict says by how much.
    NoneFits(FitVerdict),
}

/// Searches the largest batch in `1..=max_batch` whose peak fits, evaluating `peak_at`
/// (batch to peak bytes) with the same model the breakdown uses.
///
/// The peak grows with the batch: a guess from batches 1 and 2, then a gallop and a
/// bisection from it, find it in a few evaluations (O(log max_batch) at worst). A batch whose estimate fails (too large to count) does
/// not fit.
///
/// # Errors
/// The estimate's error when even batch 1 cannot be counted.
pub fn max_batch_that_fits<E>(
    max_batch: u64,
    capacity_bytes: u64,
    overheads: &Overheads,
    mut peak_at: impl FnMut(u64) -> Result<u64, E>,
) -> Result<MaxBatch, E> {
    let peak_1 = peak_at(1)?;
    let first = fit_verdict(peak_1, capacity_bytes, overheads);
    if !first.fits() {
        return Ok(MaxBatch::NoneFits(first));
    }
    let max_batch = max_batch.max(1);
    // what a batch of `b` gives, `None` for a peak too large to figure
    let mut peak = |batch: u64| peak_at(batch).ok();
    let fits_peak = |peak: u64| fit_verdict(peak, capacity_bytes, overheads).fits();
    let mut good = 1u64;
    let mut bad = None;
    // A peak grows about linearly with the batch: the line through batches 1 and 2 guesses
    // the answer, and the search gallops from the guess to where the verdict turns, so
    // that a handful of steps are estimated instead of a doubling and a bisection (the
    // answer is the same: the largest batch that fits, the peaks rising with the batch).
    let mut guess = None;
    if max_batch >= 2 {
        match peak(2) {
            Some(peak_2) if fits_peak(peak_2) => {
                good = 2;
                let room = largest_peak_that_fits(capacity_bytes, overheads).saturating_sub(peak_1);
                guess = Some(match peak_2.checked_sub(peak_1) {
                    Some(slope) if slope > 0 => 1u64.saturating_add(room / slope),
                    _ => max_batch,
                });
            }
            _ => bad = Some(2),
        }
    }
    let mut fits = |batch: u64| peak(batch).is_some_and(fits_peak);
    if let Some(guess) = guess.map(|g| g.clamp(good, max_batch)) {
        if guess > good {
            if fits(guess) {
                good = guess;
            } else {
                // down from the guess, in growing steps, to a batch that fits
                bad = Some(guess);
                let mut step = 1u64;
                while let Some(b) = bad {
                    let probe = b.saturating_sub(step);
                    if probe <= good {
                        break;
                    }
                    if fits(probe) {
                        good = probe;
                        break;
                    }
                    bad = Some(probe);
                    step = step.saturating_mul(2);
                }
            }
        }
    }
    // up from the largest batch known to fit, in growing steps, to one that does not
    let mut step = 1u64;
    while bad.is_none() && good < max_batch {
        let probe = good.saturating_add(step).min(max_batch);
        if fits(probe) {
            good = probe;
            step = step.saturating_mul(2);
        } else {
            bad = Some(probe);
        }
    }
    if let Some(bad) = bad {
        good = bisect(good, bad, &mut fits);
    }
    Ok(MaxBatch::Fits(good))
}

/// The largest `k` in `low..high` whose `fits` holds, by bisection, `low` known to fit (or
/// standing for "none") and `high` not: `low` is returned when `low + 1` does not fit.
pub(crate) fn bisect(low: u64, high: u64, mut fits: impl FnMut(u64) -> bool) -> u64 {
    let (mut good, mut bad) = (low, high);
    while bad - good > 1 {
        let mid = good + (bad - good) / 2;
        if fits(mid) {
            good = mid;
        } else {
            bad = mid;
        }
    }
    good
}

/// Micro-batch per GPU x accumulation steps x GPUs for a global batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AccumulationPlan {
    /// Samples each GPU processes per forward/backward pass.
    pub micro_batch: u64,
    /// Forward/backward passes per optimizer step.
    pub accumulation_steps: u64,
    /// Data-parallel GPUs.
    pub num_gpus: u64,
}

impl AccumulationPlan {
    /// Samples per optimizer step: micro-batch x steps x GPUs.
    #[must_use]
    pub const fn global_batch(&self) -> u64 {
        self.micro_batch
            .saturating_mul(self.accumulation_steps)
            .saturating_mul(self.num_gpus)
    }
}

/// The plan reaching at least `target_global_batch` with the fewest accumulation steps,
/// using micro-batches no larger than `max_micro_batch`, balanced so that the global batch
/// overshoots the target as little as possible. `None` when not even a micro-batch of 1 fits.
#[must_use]
pub fn plan_accumulation(
    target_global_batch: u64,
    max_micro_batch: u64,
    num_gpus: u64,
) -> Option<AccumulationPlan> {
    if max_micro_batch == 0 || num_gpus == 0 || target_global_batch == 0 {
        return None;
    }
    let per_gpu = target_global_batch.div_ceil(num_gpus);
    let accumulation_steps = per_gpu.div_ceil(max_micro_batch);
    let micro_batch = per_gpu.div_ceil(accumulation_steps);
    Some(AccumulationPlan {
        micro_batch,
        accumulation_steps,
        num_gpus,
    })
}

/// How model state is spread over data-parallel GPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Sharding {
    /// Plain data parallel (DDP): every GPU holds everything.
    #[default]
    Ddp,
    /// ZeRO-1: optimizer states sharded.
    Zero1,
    /// ZeRO-2: optimizer states and gradients sharded.
    Zero2,
    /// ZeRO-3: parameters too, the largest layer gathered at a time.
    Zero3,
    /// PyTorch's FSDP2 (`fully_shard` per layer and at the root): parameters, gradients and
    /// optimizer states sharded; each layer gathered while it runs (or kept gathered from
    /// its forward to its backward without `reshard_after_forward`), the root's from the
    /// first forward to the end of backward.
    Fsdp2,
    /// PyTorch's FSDP1 (`FullyShardedDataParallel`) as accelerate wraps a model: flat
    /// parameters per unit, split as its [`Fsdp1Sharding`] says.
    Fsdp1,
}

impl Sharding {
    /// Every strategy, in the order the page lists them.
    pub const ALL: [Sharding; 6] = [
        Sharding::Ddp,
        Sharding::Fsdp2,
        Sharding::Fsdp1,
        Sharding::Zero1,
        Sharding::Zero2,
        Sharding::Zero3,
    ];

    /// Whether the optimizer states are split across GPUs.
    #[must_use]
    pub const fn shards_optimizer_states(self) -> bool {
        !matches!(self, Sharding::Ddp)
    }

    /// Whether the gradients are split across GPUs.
    #[must_use]
    pub const fn shards_gradients(self) -> bool {
        matches!(
            self,
            Sharding::Zero2 | Sharding::Zero3 | Sharding::Fsdp2 | Sharding::Fsdp1
        )
    }

    /// DeepSpeed's ZeRO stage (`None`: another engine).
    #[must_use]
    pub const fn zero_stage(self) -> Option<u8> {
        match self {
            Sharding::Zero1 => Some(1),
            Sharding::Zero2 => Some(2),
            Sharding::Zero3 => Some(3),
            _ => None,
        }
    }

    /// Whether the parameters are split across GPUs.
    #[must_use]
    pub const fn shards_parameters(self) -> bool {
        matches!(self, Sharding::Zero3 | Sharding::Fsdp2 | Sharding::Fsdp1)
    }

    /// Short stable key used in URLs and the CLI.
    #[must_use]
    pub const fn key(self) -> &'static str {
        match self {
            Sharding::Ddp => "ddp",
            Sharding::Zero1 => "zero1",
            Sharding::Zero2 => "zero2",
            Sharding::Zero3 => "zero3",
            Sharding::Fsdp2 => "fsdp2",
            Sharding::Fsdp1 => "fsdp1",
        }
    }

    /// Name shown to a person.
    #[must_use]
    pub const fn label(self) -> &'static str {
        match self {
            Sharding::Ddp => "Data parallel (DDP)",
            Sharding::Fsdp2 => "FSDP2 (fully_shard per layer)",
            Sharding::Fsdp1 => "FSDP1 (FullyShardedDataParallel, as accelerate wraps it)",
            Sharding::Zero1 => "DeepSpeed ZeRO-1 (optimizer states sharded)",
            Sharding::Zero2 => "DeepSpeed ZeRO-2 (+ gradients)",
            Sharding::Zero3 => "DeepSpeed ZeRO-3 (+ parameters)",
        }
    }

    /// The strategy whose [`key`](Self::key) is `key` (`fsdp` is read as FSDP2).
    #[must_use]
    pub fn from_key(key: &str) -> Option<Self> {
        if key == "fsdp" {
            return Some(Sharding::Fsdp2);
        }
        Self::ALL.into_iter().find(|s| s.key() == key)
    }
}

/// Model-state bytes on each GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ShardedState {
    /// Parameters held (a shard plus, under ZeRO-3, the gathered largest layer).
    pub parameter_bytes: u64,
    /// Gradients held.
    pub gradient_bytes: u64,
    /// Optimizer states held (with any FP32 master copy).
    pub optimizer_state_bytes: u64,
}

impl ShardedState {
    /// Parameters + gradients + optimizer states.
    #[must_use]
    pub const fn total(&self) -> u64 {
        self.parameter_bytes
            .saturating_add(self.gradient_bytes)
            .saturating_add(self.optimizer_state_bytes)
    }
}

/// Splits the whole model's state over `num_gpus` GPUs with `sharding`.
///
/// `gathered_parameter_bytes` is what ZeRO-3 gathers at a time (the largest layer); it is
/// added to each GPU's shard, never exceeding the whole model.
#[must_use]
pub fn shard_model_state(
    whole: ShardedState,
    sharding: Sharding,
    num_gpus: u64,
    gathered_parameter_bytes: u64,
) -> ShardedState {
    let n = num_gpus.max(1);
    let split = |bytes: u64, sharded: bool| if sharded { bytes.div_ceil(n) } else { bytes };
    let parameter_bytes = if sharding.shards_parameters() && n > 1 {
        split(whole.parameter_bytes, true)
            .saturating_add(gathered_parameter_bytes)
            .min(whole.parameter_bytes)
    } else {
        whole.parameter_bytes
    };
    ShardedState {
        parameter_bytes,
        gradient_bytes: split(whole.gradient_bytes, sharding.shards_gradients()),
        optimizer_state_bytes: split(
            whole.optimizer_state_bytes,
            sharding.shards_optimizer_states(),
        ),
    }
}

impl fmt::Display for Sharding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mul_div_equals_128_bit_arithmetic() {
        let edges = [
            0,
            1,
            99,
            100,
            999_999,
            1 << 31,
            (1 << 32) - 1,
            1 << 32,
            1 << 40,
            u64::MAX - 1,
            u64::MAX,
        ];
        for &a in &edges {
            for &b in &edges {
                for c in [1, 3, 100, 1_000_000, u64::MAX] {
                    let exact = u128::from(a) * u128::from(b) / u128::from(c);
                    assert_eq!(mul_div(a, b, c), exact, "{a} x {b} / {c}");
                }
            }
        }
    }
    use proptest::prelude::*;

    #[test]
    fn zero_paper_example() {
        // 7.5 B parameters, mixed precision with AdamW: 2 + 2 + 12 bytes per parameter.
        let p: u64 = 7_500_000_000;
        let whole = ShardedState {
            parameter_bytes: 2 * p,
            gradient_bytes: 2 * p,
            optimizer_state_bytes: 12 * p,
        };
        let gb = |s: ShardedState| (s.total() as f64 / 1e9 * 10.0).round() / 10.0;
        assert_eq!(gb(shard_model_state(whole, Sharding::Ddp, 64, 0)), 120.0);
        assert_eq!(gb(shard_model_state(whole, Sharding::Zero1, 64, 0)), 31.4);
        assert_eq!(gb(shard_model_state(whole, Sharding::Zero2, 64, 0)), 16.6);
        assert_eq!(gb(shard_model_state(whole, Sharding::Zero3, 64, 0)), 1.9);
    }

    #[test]
    fn gpu_capacities() {
        assert_eq!(Gpu::H100_80.capacity_mib(), Some(81_559));
        assert_eq!(Gpu::Custom.capacity_mib(), None);
        assert_eq!(Gpu::CpuRam.capacity_mib(), None);
        // 2/3 up to 36 GB, 3/4 above
        assert_eq!(Gpu::Mac16.capacity_mib(), Some(16 * 1024 * 2 / 3));
        assert_eq!(Gpu::Mac36.capacity_mib(), Some(24_576));
        assert_eq!(Gpu::Mac48.capacity_mib(), Some(36_864));
        assert!(Gpu::H100_80.has_cuda_context() && Gpu::Custom.has_cuda_context());
        assert!(!Gpu::Mac64.has_cuda_context() && !Gpu::CpuRam.has_cuda_context());
        // every label that shows a capacity shows the one used
        for gpu in Gpu::ALL {
            if let Some(mib) = gpu.capacity_mib() {
                let shown = format!("{} MiB)", crate::group_thousands(mib));
                assert!(gpu.label().ends_with(&shown), "{}: {shown}", gpu.label());
            }
        }
        for gpu in Gpu::ALL {
            assert_eq!(Gpu::from_key(gpu.key()), Some(gpu));
        }
        for s in Sharding::ALL {
            assert_eq!(Sharding::from_key(s.key()), Some(s));
        }
    }

    #[test]
    fn the_largest_peak_that_fits_fits() {
        let default = Overheads::default();
        let nccl_and_vllm = Overheads {
            communication_bytes: 1 << 30,
            outside_allocator_bytes: 20_000 * BYTES_PER_MIB,
            allocator_reserve_ppm: 120_000,
            ..default
        };
        for o in [default, nccl_and_vllm] {
            for capacity_mib in [1_000, 24_576, 81_559, 196_288] {
                let capacity = capacity_mib * BYTES_PER_MIB;
                if !fit_verdict(0, capacity, &o).fits() {
                    // (the overheads alone fill the device: no peak fits)
                    continue;
                }
                let peak = largest_peak_that_fits(capacity, &o);
                assert!(
                    fit_verdict(peak, capacity, &o).fits(),
                    "{capacity_mib} {o:?}"
                );
                assert!(
                    !fit_verdict(peak + 100, capacity, &o).fits(),
                    "{capacity_mib} {o:?}"
                );
            }
        }
    }

    #[test]
    fn the_reserve_leaves_out_what_the_allocator_does_not_hold() {
        let o = Overheads {
            outside_allocator_bytes: 24_000_000_000,
            ..Overheads::default()
        };
        // 5% of the 10 GB the allocator holds, none of vLLM's 24 GB
        let v = fit_verdict(34_000_000_000, 80_000 * BYTES_PER_MIB, &o);
        assert_eq!(v.allocator_reserve_bytes, 500_000_000);
    }

    #[test]
    fn verdict_counts_every_overhead() {
        let o = Overheads::default();
        let v = fit_verdict(10_000_000_000, 16_000 * BYTES_PER_MIB, &o);
        assert_eq!(v.allocator_reserve_bytes, 500_000_000);
        assert_eq!(v.needed_bytes, 10_500_000_000 + 500 * BYTES_PER_MIB);
        assert_eq!(v.usable_bytes, 16_000 * BYTES_PER_MIB * 95 / 100);
        assert!(v.fits());
        assert_eq!(v.bytes_left(), v.usable_bytes - v.needed_bytes);
        let v = fit_verdict(20_000_000_000, 16_000 * BYTES_PER_MIB, &o);
        assert!(!v.fits());
        assert_eq!(v.bytes_missing(), v.needed_bytes - v.usable_bytes);
    }

    #[track_caller]
    fn plan(target: u64, max_micro: u64, gpus: u64, expected: (u64, u64)) {
        let p = plan_accumulation(target, max_micro, gpus).unwrap();
        assert_eq!(
            (p.micro_batch, p.accumulation_steps),
            expected,
            "{target} on {gpus} GPUs, micro <= {max_micro}"
        );
        assert!(p.global_batch() >= target);
        assert!(p.micro_batch <= max_micro);
    }

    #[test]
    fn accumulation_plans() {
        plan(256, 16, 8, (16, 2));
        plan(256, 24, 8, (16, 2));
        plan(100, 7, 1, (7, 15));
        plan(8, 64, 1, (8, 1));
        plan(1000, 3, 7, (3, 48));
        assert_eq!(plan_accumulation(8, 0, 1), None);
    }

    proptest! {
        #[test]
        fn largest_batch_fits_and_one_more_does_not(
            fixed in 0u64..100_000_000_000,
            per_sample in 1u64..10_000_000_000,
            capacity_mib in 1_000u64..200_000,
            margin in 0u64..50,
        ) {
            let overheads = Overheads { safety_margin_percent: margin, ..Overheads::default() };
            let capacity = capacity_mib * BYTES_PER_MIB;
            let peak = |b: u64| fixed.checked_add(b.checked_mul(per_sample).ok_or(())?).ok_or(());
            match max_batch_that_fits(1 << 24, capacity, &overheads, peak).unwrap() {
                MaxBatch::Fits(b) => {
                    prop_assert!(fit_verdict(peak(b).unwrap(), capacity, &overheads).fits());
                    if b < 1 << 24 {
                        let next = peak(b + 1).map(|p| fit_verdict(p, capacity, &overheads).fits());
                        prop_assert_ne!(next, Ok(true));
                    }
                }
                MaxBatch::NoneFits(v) => prop_assert!(!v.fits()),
            }
        }

        /// Peaks that curve and jump (rounding, a kernel's workspace) but never fall: the
        /// search from the line's guess finds what a doubling and a bisection find.
        #[test]
        fn the_guess_finds_what_bisection_finds(
            fixed in 0u64..50_000_000_000,
            per_sample in 0u64..5_000_000_000,
            curve in 0u64..2_000_000,
            jump_every in 1u64..64,
            jump in 0u64..3_000_000_000,
            capacity_mib in 1_000u64..200_000,
            max in 1u64..1 << 24,
        ) {
            let overheads = Overheads::default();
            let capacity = capacity_mib * BYTES_PER_MIB;
            let peak = |b: u64| -> Result<u64, ()> {
                let linear = b.checked_mul(per_sample).ok_or(())?;
                let curved = b.checked_mul(b).and_then(|x| x.checked_mul(curve)).ok_or(())? >> 10;
                let jumps = (b / jump_every).checked_mul(jump).ok_or(())?;
                fixed.checked_add(linear).and_then(|x| x.checked_add(curved))
                    .and_then(|x| x.checked_add(jumps)).ok_or(())
            };
            let fits = |b: u64| peak(b).is_ok_and(|p| fit_verdict(p, capacity, &overheads).fits());
            let expected = if !fits(1) {
                None
            } else {
                let (mut good, mut bad) = (1u64, None);
                while bad.is_none() && good < max {
                    let probe = (good * 2).min(max);
                    if fits(probe) { good = probe } else { bad = Some(probe) }
                }
                if let Some(mut bad) = bad {
                    while bad - good > 1 {
                        let mid = good + (bad - good) / 2;
                        if fits(mid) { good = mid } else { bad = mid }
                    }
                }
                Some(good)
            };
            let found = match max_batch_that_fits(max, capacity, &overheads, peak) {
                Ok(MaxBatch::Fits(b)) => Some(b),
                _ => None,
            };
            prop_assert_eq!(found, expected);
        }

        #[test]
        fn zero_stages_never_increase_memory(
            p in 1u64..1_000_000_000_000, g in 0u64..1_000_000_000_000, o in 0u64..10_000_000_000_000,
            gpus in 1u64..1024, gathered_share in 0u64..100,
        ) {
            let whole = ShardedState { parameter_bytes: p, gradient_bytes: g, optimizer_state_bytes: o };
            let gathered = p / 100 * gathered_share;
            let totals: Vec<u64> = [Sharding::Ddp, Sharding::Zero1, Sharding::Zero2, Sharding::Zero3]
                .iter()
                .map(|&s| shard_model_state(whole, s, gpus, gathered).total())
                .collect();
            prop_assert!(totals.windows(2).all(|w| w[1] <= w[0]), "{totals:?}");
            prop_assert_eq!(totals[0], whole.total());
        }

        #[test]
        fn plans_reach_the_target(target in 1u64..1_000_000, max_micro in 1u64..10_000, gpus in 1u64..512) {
            let p = plan_accumulation(target, max_micro, gpus).unwrap();
            prop_assert!(p.global_batch() >= target);
            prop_assert!(p.micro_batch <= max_micro && p.micro_batch >= 1);
            // No fewer steps would do.
            prop_assert!((p.accumulation_steps - 1) * max_micro * gpus < target);
        }
    }
}
