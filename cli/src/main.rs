//! `memest`: the estimator in a terminal, for scripts and CI jobs.
//!
//! Reads a Hugging Face `config.json` (or a preset, or the page's query string), estimates
//! the peak memory of one training step with the same core as the page, and prints a
//! readable breakdown or one JSON object.

use std::process::ExitCode;

use estimator_core::{
    decode_query, encode_query, format_bytes, group_thousands, vllm_gib, ByteUnit, Change,
    Evaluation, EvaluationError, Field, FitPlan, Gpu, HubId, KvDtype, LongestSequence, LossKind,
    MaxBatch, Method, Mode, ModelFamily, ObjectiveKind, OptimizerImpl, PageState, PartKind, Preset,
    Scenario, ServeChange, Serving, Trainer, WeightFormat,
};

mod hub;

const USAGE: &str = "\
usage: memest [--config PATH | --hub ID | --preset KEY | --query QUERY] [options]

model (one of):
  --config PATH         a Hugging Face config.json
  --hub ID              a model on the Hugging Face Hub, owner/name or owner/name@rev:
                        its config.json (a vision-language model's
                        preprocessor_config.json too) fetched with curl (no token)
                        and cached; offline (or with HF_HUB_OFFLINE=1), the cached
                        copy: memest's, in
                        $XDG_CACHE_HOME/memest/hub, else Hugging Face's ($HF_HUB_CACHE)
  --preset KEY          a published model (keys below)
  --query QUERY         the page's query string (a shared link's part after '?')

step:
  --batch N             samples per step (per GPU); with --pp, per micro-batch: a stage
                        runs --microbatches of them per step (torchtitan's local batch
                        divided by its micro-batches)
  --seq N               tokens per sample (image side in pixels for ViT; text tokens for
                        a vision-language model, its image tokens added; DPO and GRPO take
                        --max-prompt and --max-completion instead)
  --precision P         fp32, amp-bf16, amp-fp16, bf16, mixed-bf16, mixed-fp16
  --optimizer O         adamw, sgd, sgd-momentum, adamw8bit, paged-adamw8bit
                        (bitsandbytes), adafactor (torch.optim), adafactor-hf
                        (transformers), none
  --optimizer-impl I    how torch.optim runs AdamW / SGD: fused (one in-place kernel,
                        HF Trainer's and TRL's default), foreach (torch.optim's default:
                        AdamW allocates a parameter-sized temporary; the default here
                        without --trainer), forloop (two temporaries of the largest
                        tensor); refused with the other optimizers, which run their own
  --attention A         sdpa, eager, flash2 (flash_attention_2: varlen, never a mask)
  --checkpointing C     none, full, offload (layer inputs in CPU memory), every:N
                        (N from 2 to 8: layers N-1, 2N-1, ... as torchtitan and
                        torchtune choose them), ops (torchtitan's per-op policy: SDPA and
                        every other matmul saved)
  --compile C           torch.compile: off (default), blocks (each block, the loss eager:
                        torchtitan before 2025-04), layers (each block and the loss:
                        torchtitan, torchtune), model (the whole model with its loss:
                        HF Trainer torch_compile=True)
  --float8 F            torchao float8 training on every linear but the head: off
                        (default), tensorwise, rowwise (the step saves what bf16
                        saves; the casts inside each linear are not counted)
  --float8-all-gather on|off
                        FSDP2 gathers the float8 weights a byte each (tensorwise
                        only; default off)
  --trainer T           a trainer's defaults (loss, packing, checkpointing, attention,
                        optimizer implementation; Unsloth's also its kernels, QLoRA
                        r 16 on every linear, bf16, AdamW 8-bit), before any of them:
{trainers}  --loss L              the trainer's loss (causal LMs; default hf):
{losses}  --packing on|off      documents packed per row, position ids restarting (a block-causal
                        mask under sdpa and eager; default off)
  --padding on|off      rows padded to the longest: a 4-D mask, SDPA's memory-efficient
                        kernel (default off: every token real, the mask dropped)
  --optimizer-in-backward on|off
                        torchtune's optimizer_in_bwd: each parameter stepped as its
                        gradient arrives, no optimizer-step phase (default off)
  --activation-offload on|off
                        torchtune's enable_activation_offloading: saved tensors to pinned
                        CPU memory, the last 5 on the GPU until copied (default off)
  --kernels K           the layers' kernels under LoRA / QLoRA: torch (default:
                        transformers and peft), unsloth (Unsloth 2026.3's fused LoRA
                        kernels and offloaded checkpointing, derived from source),
                        unsloth-2024.12 (the release its published tables measured)
  --generate N          tokens generated after the prompt (KV cache; optimizer none)

inference (--optimizer none):
  --weight-format F     weights' storage (default recipe: as --precision; fp16 = bf16):
{weight_formats}  --kv-dtype D          KV cache with --generate or --serve: {kv_dtypes}

serving (vLLM v0.11.0's start-up, per GPU of its tensor-parallel group):
  --serve vllm          the KV cache vLLM sizes on --gpu: tokens, concurrency at
                        --max-model-len, the longest max_model_len, where memory goes
                        (--tp N splits the model; --gpus defaults to it)
  --gpu-memory-utilization U
                        the fraction of the device vLLM may take (default 0.9)
  --max-model-len L     tokens per request (default: the model's own context)
  --max-num-seqs N      requests per step (default 1024 on H100/H200/B200/MI300X,
                        256 elsewhere, never above --max-num-batched-tokens)
  --max-num-batched-tokens M
                        tokens per step, the profile's forward (default 8192 on
                        H100/H200/B200/MI300X, 2048 elsewhere)
  --enforce-eager       no CUDA graphs
  --enable-expert-parallel
                        a mixture's experts spread whole over the --tp ranks (EP =
                        TP) instead of each split on its inner width (or --ep N, N = TP)
  --sampler S           torch (default: a plain pip install, PyTorch's top-k/top-p sort)
                        or flashinfer (vLLM's Docker image: about a third of the
                        sampler's profile memory)
  (--weight-format bf16, fp8, int4-g128 for AWQ/GPTQ, mxfp4 for gpt-oss; --kv-dtype
   model or fp8)

objective (TRL 1.16):
  --objective O         sft (default), dpo, grpo; --trainer trl-dpo | trl-grpo sets TRL's
                        defaults. DPO: --batch counts pairs; GRPO: prompts per step
  --reference R         separate (a frozen copy), adapters-off (LoRA base, adapters
                        disabled), precomputed (DPO), none (GRPO's beta = 0)
  --generations N       GRPO: completions per prompt (default 8)
  --max-prompt N        prompt tokens per sequence (default 512)
  --max-completion N    completion tokens per sequence, the scored ones (default 512)
  --generator G         GRPO: model (its generate), vllm-colocated, vllm-server
  --vllm-memory F       colocated vLLM's gpu_memory_utilization (default 0.3)

images (vision-language models: qwen2_5_vl, qwen3_vl, gemma3, llava, llava_next,
idefics3, smolvlm, mllama):
  --images N            images per sample (default 0: text only, the tower's weights idle)
  --image-size WxH      each image's width x height in pixels (default 1024x768); the
                        processor's tiles and tokens follow from it (--json image_tokens)
  --vision V            the vision tower: frozen (default) or trained
  --projector P         the projector: trained (default) or frozen

fine-tuning:
  --method M            full, lora, qlora (LoRA on a 4-bit bitsandbytes base)
  --lora-r N            adapter rank (default 16)
  --lora-alpha A        lora_alpha (scales the output; no memory effect; default 32)
  --lora-dropout P      lora_dropout, 0 <= P < 1 (default 0: no masks)
  --lora-targets T      all-linear, attention, mlp, or module names: q_proj,v_proj
  --lora-dtype D        fp32 (peft's default), model
  --base-dtype D        the frozen base as loaded: recipe (default: the precision's
                        weights), fp32 (torch_dtype=float32: a 16-bit recipe then runs in
                        fp32, or as AMP under TRL's DPO/GRPO autocast)
  --quant Q             qlora: nf4, fp4
  --double-quant on|off qlora: double quantization (default on)
  --kbit-prepare on|off qlora: prepare_model_for_kbit_training (default on)

hardware:
{gpu_line}                        (mac-N: Apple silicon, N GB unified memory; cpu: the CPU's RAM)
  --capacity-mib N      capacity of a custom GPU
  --ram-gib N           capacity of the CPU RAM in GiB, with --gpu cpu (default 64)
  --allocator A         PyTorch's caching allocator: default, expandable
                        (expandable_segments:True); the step is replayed through it and
                        the verdict counts what it reserves (--json reserved_bytes)
  --allocator-reserve P the reserve in percent of the peak instead of the replay
  --gpus N              GPUs in all (a multiple of tp x cp x pp; the rest data parallel)
  --engine E            data-parallel engine: ddp, fsdp2 (fully_shard per layer),
                        fsdp1 (FullyShardedDataParallel as accelerate wraps it),
                        deepspeed (with --zero)
  --zero 1|2|3          DeepSpeed ZeRO stage (implies --engine deepspeed)
  --sharding S          the same as one key: ddp, fsdp2, fsdp1, zero1, zero2, zero3
  --reshard-after-forward on|off|N
                        FSDP2: free each layer's gathered weights after its forward
                        (default on), keep them, or reshard them over N GPUs
  --shard-embeddings on|off
                        FSDP2: the embeddings and the head as their own units,
                        gathered only while they run (torchtune's
                        custom_sharded_layers: ['tok_embeddings', 'output']; default
                        off: in the root, gathered from forward to the end of backward)
  --fsdp1-sharding S    FSDP1's sharding_strategy: full (FULL_SHARD, default),
                        grad-op (SHARD_GRAD_OP), hybrid (HYBRID_SHARD: sharded within
                        a node of --gpus-per-node), no-shard (NO_SHARD)
  --fsdp1-wrap W        FSDP1's units: none (accelerate's default NO_WRAP: the whole
                        model one flat parameter), layers (TRANSFORMER_BASED_WRAP)
  --use-orig-params on|off
                        FSDP1's use_orig_params (accelerate's default off)
  --backward-prefetch P FSDP1's backward_prefetch: none (accelerate's default), pre, post
  --gpus-per-node N     GPUs per node: HYBRID_SHARD's shard group (default 8)
  --offload O           none (default), optimizer (DeepSpeed offload_optimizer),
                        optimizer+params (ZeRO-3 offload_param, FSDP2 CPUOffloadPolicy,
                        FSDP1 CPUOffload(offload_params=True)): the host RAM it needs is
                        printed
  --reduce-bucket N     DeepSpeed reduce_bucket_size, elements (default 5e8)
  --prefetch-bucket N   DeepSpeed stage3_prefetch_bucket_size, elements (default 5e7)
  --nccl-mib N          NCCL buffers per communicator, one per parallel dimension
                        (default 512: NCCL_BUFFSIZE 4 MiB x 32 channels x 2 peers x 2)
  --tp N                tensor-parallel group size (torchtitan's plan)
  --sp on|off           sequence parallelism in the tensor-parallel group (default off)
  --loss-parallel on|off
                        logits left split over the vocabulary for the loss (default off:
                        gathered whole on every rank)
  --tp-plan P           torchtitan (default) or megatron (Megatron-LM's
                        vocabulary-parallel cross-entropy, in place: implies
                        --loss-parallel on)
  --cp N                context-parallel group size (ring attention over SDPA)
  --pp N                pipeline stages (the busiest stage's GPU is shown)
  --pp-schedule S       1f1b (default), gpipe, interleaved (two chunks per GPU)
  --microbatches N      micro-batches per step through the pipeline (default: --pp)
  --ep N                expert-parallel group size (mixtures of experts; divides the
                        data-parallel GPUs)
  --global-batch N      samples per optimizer step to reach with accumulation

output:
  --advise              then the configurations that fit on the GPU, best first
  --json                one JSON object instead of the readable breakdown (with a GPU:
                        max_batch, and max_seq, the longest sequence that fits at the
                        batch given, on a grid of 128 tokens; DPO/GRPO: the completion)
  --gib                 readable figures in GiB instead of GB
  -h, --help            this text";

/// `words` joined by ", " and wrapped to lines of at most 90 characters, each indented.
fn wrapped(words: &[&str], indent: &str) -> String {
    if words.is_empty() {
        return String::new();
    }
    prose(&words.join(", "), indent)
}

/// The column where the description of an option starts in [`USAGE`].
const OPTION_COLUMN: usize = 24;

/// `words` wrapped under the descriptions of the options, the first line starting with
/// `flag`.
fn option_line(flag: &str, words: &[&str]) -> String {
    let text = wrapped(words, &" ".repeat(OPTION_COLUMN));
    let head = format!("  {flag:<width$}", width = OPTION_COLUMN - 2);
    format!("{head}{}", &text[OPTION_COLUMN..])
}

/// The `--help` text: the options, with the GPU keys, weight formats and KV-cache dtypes,
/// then the `model_type` values `--config` reads and the preset keys, all from the core so
/// they never fall behind it.
fn usage() -> String {
    let types = ModelFamily::supported_model_types();
    let types: Vec<&str> = types.split(", ").collect();
    let presets: Vec<&str> = Preset::ALL.iter().map(|p| p.key()).collect();
    let mut gpus: Vec<&str> = Gpu::ALL.iter().map(|g| g.key()).collect();
    gpus.push("none");
    let formats: Vec<&str> = WeightFormat::ALL.iter().map(|f| f.key()).collect();
    let kv: Vec<&str> = KvDtype::ALL.iter().map(|k| k.key()).collect();
    let options = USAGE
        .replace("{gpu_line}", &option_line("--gpu KEY", &gpus))
        .replace(
            "{weight_formats}",
            &wrapped(&formats, &" ".repeat(OPTION_COLUMN)),
        )
        .replace("{kv_dtypes}", &kv.join(", "))
        .replace("{losses}", &losses())
        .replace("{trainers}", &trainers());
    format!(
        "{options}\n\nconfig.json model_type values (--config, --hub, --query):\n{}\npreset keys (--preset):\n{}",
        wrapped(&types, "  "),
        wrapped(&presets, "  ").trim_end()
    )
}

/// One line per trainer under `--trainer`: its key and what it stands for.
fn trainers() -> String {
    key_lines(Trainer::ALL.map(|t| (t.key(), t.label())), 10)
}

/// One line per loss under `--loss`: its key and which trainer uses it.
fn losses() -> String {
    key_lines(LossKind::ALL.map(|l| (l.key(), l.label())), 18)
}

/// `(key, label)` rows under an option's description, the keys padded to `key_width`.
fn key_lines<const N: usize>(rows: [(&str, &str); N], key_width: usize) -> String {
    let indent = " ".repeat(OPTION_COLUMN);
    rows.iter()
        .map(|(key, label)| format!("{indent}{key:<key_width$}{label}\n"))
        .collect()
}

struct Options {
    state: PageState,
    json: bool,
    advise: bool,
    notices: Vec<String>,
    /// `--hub`: the model's id, and whether it named its revision; its config is read
    /// after the arguments.
    hub: Option<(HubId, bool)>,
}

/// Flags that set one input of the page, with the input they set.
const FIELD_FLAGS: [(&str, Field); 72] = [
    ("--batch", Field::Batch),
    ("--seq", Field::SeqLen),
    ("--precision", Field::Recipe),
    ("--optimizer", Field::Optimizer),
    ("--optimizer-impl", Field::OptimizerImpl),
    ("--attention", Field::Attention),
    ("--checkpointing", Field::Checkpointing),
    ("--compile", Field::Compile),
    ("--float8", Field::Float8),
    ("--float8-all-gather", Field::Float8AllGather),
    ("--loss", Field::Loss),
    ("--packing", Field::Packing),
    ("--padding", Field::Padding),
    ("--optimizer-in-backward", Field::OptimizerInBackward),
    ("--activation-offload", Field::ActivationOffload),
    ("--kernels", Field::Kernels),
    ("--objective", Field::Objective),
    ("--reference", Field::Reference),
    ("--generations", Field::Generations),
    ("--max-prompt", Field::MaxPrompt),
    ("--max-completion", Field::MaxCompletion),
    ("--generator", Field::Generator),
    ("--vllm-memory", Field::VllmMemory),
    ("--images", Field::Images),
    ("--image-size", Field::ImageSize),
    ("--vision", Field::VisionTower),
    ("--projector", Field::Projector),
    ("--generate", Field::NewTokens),
    ("--weight-format", Field::WeightFormat),
    ("--kv-dtype", Field::KvDtype),
    ("--gpu-memory-utilization", Field::GpuMemoryUtilization),
    ("--max-model-len", Field::MaxModelLen),
    ("--max-num-seqs", Field::MaxNumSeqs),
    ("--max-num-batched-tokens", Field::MaxNumBatchedTokens),
    ("--gpu", Field::Gpu),
    ("--capacity-mib", Field::CustomCapacity),
    ("--allocator", Field::Allocator),
    ("--allocator-reserve", Field::AllocatorReserve),
    ("--ram-gib", Field::RamCapacity),
    ("--gpus", Field::NumGpus),
    ("--sharding", Field::Sharding),
    ("--tp", Field::TensorParallel),
    ("--sp", Field::SequenceParallel),
    ("--shard-embeddings", Field::ShardEmbeddings),
    ("--loss-parallel", Field::LossParallel),
    ("--tp-plan", Field::TpPlan),
    ("--cp", Field::ContextParallel),
    ("--pp", Field::PipelineParallel),
    ("--pp-schedule", Field::PipelineSchedule),
    ("--microbatches", Field::Microbatches),
    ("--reshard-after-forward", Field::ReshardAfterForward),
    ("--fsdp1-sharding", Field::Fsdp1Sharding),
    ("--fsdp1-wrap", Field::Fsdp1Wrap),
    ("--use-orig-params", Field::UseOrigParams),
    ("--backward-prefetch", Field::BackwardPrefetch),
    ("--gpus-per-node", Field::GpusPerNode),
    ("--offload", Field::Offload),
    ("--nccl-mib", Field::NcclMib),
    ("--reduce-bucket", Field::ReduceBucket),
    ("--prefetch-bucket", Field::PrefetchBucket),
    ("--ep", Field::ExpertParallel),
    ("--global-batch", Field::GlobalBatch),
    ("--method", Field::Method),
    ("--lora-r", Field::LoraRank),
    ("--lora-alpha", Field::LoraAlpha),
    ("--lora-dropout", Field::LoraDropout),
    ("--lora-targets", Field::LoraTargets),
    ("--lora-dtype", Field::LoraDtype),
    ("--base-dtype", Field::BaseDtype),
    ("--quant", Field::Quant),
    ("--double-quant", Field::DoubleQuant),
    ("--kbit-prepare", Field::KbitPrepare),
];

/// Flags that mean something only with `--method lora` or `qlora`, and the QLoRA-only ones.
const LORA_FLAGS: [&str; 6] = [
    "--lora-r",
    "--lora-alpha",
    "--lora-dropout",
    "--lora-targets",
    "--lora-dtype",
    "--base-dtype",
];
const SERVE_FLAGS: [&str; 7] = [
    "--enable-expert-parallel",
    "--sampler",
    "--gpu-memory-utilization",
    "--max-model-len",
    "--max-num-seqs",
    "--max-num-batched-tokens",
    "--enforce-eager",
];
const QLORA_FLAGS: [&str; 3] = ["--quant", "--double-quant", "--kbit-prepare"];
/// Flags that mean something only for a vision-language model.
const IMAGE_FLAGS: [&str; 4] = ["--images", "--image-size", "--vision", "--projector"];

fn set(state: &mut PageState, flag: &str, field: Field, value: &str) -> Result<(), String> {
    state
        .set(field, value)
        .map_err(|why| format!("{flag} {value:?}: {why}"))
}

fn parse_args(args: &[String]) -> Result<Options, String> {
    let mut state = {
        let mut page_state = PageState {
            mode: Mode::Architecture,
            ..PageState::default()
        };
        page_state.model.preset = None;
        page_state.hardware.gpu = None;
        // without a trainer, `--optimizer adamw` is torch.optim.AdamW's default on CUDA
        page_state.step.optimizer_impl = OptimizerImpl::Foreach;
        page_state
    };
    let mut notices = Vec::new();
    let mut json = false;
    let mut advise = false;
    let mut hub = None;
    let mut i = 0;
    // The query is applied first so that flags refine a shared link, then the trainer's
    // defaults so that flags refine those.
    if let Some(at) = args.iter().position(|a| a == "--query") {
        let query = args.get(at + 1).ok_or("--query needs a value")?;
        let decoded = decode_query(query);
        state = decoded.state;
        notices = decoded.notices;
    }
    if let Some(at) = args.iter().position(|a| a == "--trainer") {
        let key = args.get(at + 1).ok_or("--trainer needs a value")?;
        let trainer = Trainer::from_key(key).ok_or_else(|| {
            let keys: Vec<&str> = Trainer::ALL.iter().map(|t| t.key()).collect();
            format!("--trainer: expected one of {}.", keys.join(", "))
        })?;
        trainer.apply(&mut state);
    }
    while i < args.len() {
        let flag = args[i].as_str();
        let mut value = || -> Result<&str, String> {
            i += 1;
            args.get(i)
                .map(String::as_str)
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match flag {
            "-h" | "--help" => return Err(String::new()),
            "--json" => json = true,
            "--advise" => advise = true,
            "--gib" => state.byte_unit = ByteUnit::Gib,
            "--query" | "--trainer" => {
                value()?;
            }
            "--config" => {
                let path = value()?;
                let text = std::fs::read_to_string(path)
                    .map_err(|e| format!("cannot read {path}: {e}"))?;
                state.mode = Mode::Architecture;
                state.model.preset = None;
                state.model.config_json = text;
            }
            "--hub" => {
                let text = value()?;
                let id = HubId::parse(text).map_err(|why| format!("--hub {text:?}: {why}"))?;
                state.mode = Mode::Architecture;
                state.model.preset = None;
                hub = Some((id, text.contains('@')));
            }
            "--engine" => {
                let engine = value()?;
                let key = match engine {
                    "ddp" | "fsdp2" | "fsdp1" => engine,
                    // the stage comes with --zero (ZeRO-2 until it does)
                    "deepspeed" if state.parallel.sharding.key().starts_with("zero") => {
                        state.parallel.sharding.key()
                    }
                    "deepspeed" => "zero2",
                    other => {
                        return Err(format!(
                            "--engine {other:?}: expected one of ddp, fsdp2, fsdp1, deepspeed."
                        ))
                    }
                };
                set(&mut state, flag, Field::Sharding, key)?;
            }
            "--zero" => {
                let stage = value()?;
                if !matches!(stage, "1" | "2" | "3") {
                    return Err(format!("--zero {stage:?}: expected 1, 2 or 3."));
                }
                set(&mut state, flag, Field::Sharding, &format!("zero{stage}"))?;
            }
            "--serve" => {
                let engine = value()?;
                let on = match engine {
                    "vllm" => "on",
                    "off" => "off",
                    other => return Err(format!("--serve {other:?}: expected vllm or off.")),
                };
                set(&mut state, flag, Field::Serve, on)?;
                // vLLM runs the model without gradients
                set(&mut state, flag, Field::Optimizer, "none")?;
            }
            "--enforce-eager" => set(&mut state, flag, Field::EnforceEager, "on")?,
            // EP = TP, set once --tp is known (below)
            "--enable-expert-parallel" => {}
            "--sampler" => {
                let on = match value()? {
                    "flashinfer" => "on",
                    "torch" => "off",
                    other => {
                        return Err(format!(
                            "--sampler {other:?}: expected flashinfer or torch."
                        ))
                    }
                };
                set(&mut state, flag, Field::FlashinferSampler, on)?;
            }
            "--preset" => {
                state.mode = Mode::Architecture;
                set(&mut state, flag, Field::Model, value()?)?;
            }
            other => match FIELD_FLAGS.iter().find(|(name, _)| *name == other) {
                Some((_, field)) => set(&mut state, flag, *field, value()?)?,
                None => return Err(format!("unknown argument {other:?}")),
            },
        }
        i += 1;
    }
    let given = |flags: &[&'static str]| -> Option<&'static str> {
        flags.iter().copied().find(|f| args.iter().any(|a| a == f))
    };
    if let Some(flag) = given(&LORA_FLAGS).or(given(&QLORA_FLAGS)) {
        if state.training.method == Method::Full {
            return Err(format!("{flag} needs --method lora or --method qlora"));
        }
    }
    if let Some(flag) = given(&QLORA_FLAGS) {
        if state.training.method != Method::Qlora {
            return Err(format!("{flag} needs --method qlora"));
        }
    }
    if let Some(flag) = given(&IMAGE_FLAGS) {
        // a model that does not parse is reported as such when it is evaluated
        if let Ok(arch) = state.architecture() {
            if state.mode == Mode::Architecture && !arch.is_vision_language() {
                return Err(format!(
                    "{flag} needs a vision-language model (its config's model_type one of qwen2_5_vl, qwen3_vl, gemma3 with a vision_config, llava, llava_next, idefics3, smolvlm, mllama): this {} model takes no images",
                    arch.family().label()
                ));
            }
        }
    }
    // DPO and GRPO train on `prompt + completion` tokens per sequence (TRL 1.16's
    // `DPOConfig` / `GRPOConfig` `max_prompt_length` and `max_completion_length`): the page
    // hides the sequence field for them, and a `--seq` read as one split of those two would
    // be a guess
    let rl = state.step.optimizer.trains() && state.step.objective != ObjectiveKind::Sft;
    if rl && given(&["--seq"]).is_some() {
        return Err(format!(
            "--seq does not apply to --objective {}: its sequences are --max-prompt + --max-completion tokens ({} + {} now); give those instead",
            state.step.objective.key(),
            state.step.max_prompt.trim(),
            state.step.max_completion.trim()
        ));
    }
    if let Some(flag) = given(&["--max-prompt", "--max-completion"]).filter(|_| !rl) {
        return Err(format!(
            "{flag} needs --objective dpo or grpo (and an optimizer): supervised fine-tuning's sequence is --seq"
        ));
    }
    if let Some(why) =
        given(&["--optimizer-impl"]).and(state.step.optimizer.ignores_implementation())
    {
        return Err(format!(
            "--optimizer-impl applies to torch.optim's AdamW and SGD (--optimizer adamw, sgd, sgd-momentum), not {}: {why}",
            state.step.optimizer.key()
        ));
    }
    let serving = state.inference.serve;
    if let Some(flag) = given(&SERVE_FLAGS).filter(|_| !serving) {
        return Err(format!("{flag} needs --serve vllm"));
    }
    if serving && given(&["--gpus"]).is_none() {
        // one vLLM server: its tensor-parallel group
        let tp = state.parallel.tensor_parallel.clone();
        set(&mut state, "--tp", Field::NumGpus, &tp)?;
    }
    if let Some(flag) = given(&["--enable-expert-parallel"]) {
        let tp = state.parallel.tensor_parallel.clone();
        set(&mut state, flag, Field::ExpertParallel, &tp)?;
    }
    if given(&["--weight-format"]).is_some() && state.step.optimizer.trains() {
        return Err("--weight-format needs --optimizer none (inference)".to_owned());
    }
    if given(&["--kv-dtype"]).is_some()
        && !serving
        && (state.step.optimizer.trains()
            || state.inference.new_tokens.trim().parse::<u64>() == Ok(0))
    {
        return Err("--kv-dtype needs --optimizer none and --generate N".to_owned());
    }
    if given(&["--ram-gib"]).is_some() && state.hardware.gpu != Some(Gpu::CpuRam) {
        return Err("--ram-gib needs --gpu cpu".to_owned());
    }
    if let Some(flag) = given(&["--config", "--preset"]).filter(|_| hub.is_some()) {
        return Err(format!("--hub and {flag} both name the model: give one"));
    }
    if advise && state.hardware.gpu.is_none() {
        return Err("--advise needs a device to fit the step on: --gpu KEY".to_owned());
    }
    if state.mode == Mode::Architecture
        && state.model.preset.is_none()
        && state.model.config_json.is_empty()
        && hub.is_none()
    {
        return Err("give a model: --config PATH, --hub ID, --preset KEY or --query".to_owned());
    }
    Ok(Options {
        state,
        json,
        advise,
        notices,
        hub,
    })
}

/// Parameter counts of a mixture of experts beyond its total.
struct MoeCounts {
    /// Parameters one token runs through.
    active: u64,
    /// Parameters of the routed experts (what `--ep` splits).
    routed: u64,
}

/// The counts of the model when it is a mixture of experts (architecture mode).
fn moe_counts(state: &PageState) -> Option<MoeCounts> {
    if state.mode != Mode::Architecture {
        return None;
    }
    let arch = state.architecture().ok()?;
    arch.is_moe().then(|| MoeCounts {
        active: arch.active_parameter_count(),
        routed: arch.routed_expert_parameter_count(),
    })
}

/// The image tokens per sample of a vision-language model with images (architecture mode).
fn image_tokens(state: &PageState) -> Option<estimator_core::ImageTokens> {
    if state.mode != Mode::Architecture {
        return None;
    }
    let arch = state.architecture().ok()?;
    let vision = state.parsed_vision(&arch).ok()?.filter(|v| v.images > 0)?;
    let text = state.parsed_seq_len().ok()?;
    estimator_core::image_tokens(&arch, text, &vision).ok()
}

fn to_json(
    e: &Evaluation,
    state: &PageState,
    longest: Option<&LongestSequence>,
) -> serde_json::Value {
    let mut at_peak = serde_json::Map::new();
    for (kind, bytes) in &e.step.parts {
        at_peak.insert(kind.key().replace('-', "_"), (*bytes).into());
    }
    let mut activation_parts = serde_json::Map::new();
    for (part, bytes) in &e.step.activation_parts {
        activation_parts.insert(part.key().replace('-', "_"), (*bytes).into());
    }
    let mut out = serde_json::json!({
        "n_params": e.n_params,
        "peak_bytes": e.step.peak_bytes,
        // forward, backward or optimizer step, inside the training phase for DPO and GRPO
        "peak_phase": e
            .step
            .objective_phases
            .map_or(e.step.peak_phase, |p| Some(p.training_peak_phase))
            .map(|p| p.key()),
        "at_peak": at_peak,
        "activation_parts": activation_parts,
        "batch": e.batch,
        "model_state_bytes": e.step.model_state_bytes,
        "activation_bytes": e.step.activation_bytes,
        // figures of one GPU of several: the busiest (with pipelines, its stage)
        "per_gpu": if e.per_gpu {
            serde_json::json!({
                "peak_bytes": e.step.peak_bytes,
                "stage": e.step.stage,
                "gpus": e.plan.total_gpus(),
            })
        } else {
            serde_json::Value::Bool(false)
        },
        "query": estimator_core::encode_query(state),
    });
    out["trainable_params"] = e.step.trainable_params.into();
    // forward and backward passes of the step shown (gradient accumulation to the global
    // batch): from the second on, every gradient is alive through them
    out["micro_batches"] = e.plan.micro_batches_at(e.batch).into();
    if let Some(p) = e.step.objective_phases {
        out["phases"] = serde_json::json!({
            "generation": p.generation_bytes,
            "scoring": p.scoring_bytes,
            "training": p.training_bytes,
        });
        // which phase of the step sets the peak (generation, scoring, training)
        out["peak_step_phase"] = p.peak.key().into();
    }
    // max_memory_reserved: the peak and what the caching allocator holds beyond it
    out["reserved_bytes"] = e.reserved_bytes().into();
    // host RAM per GPU process for what FSDP2 or DeepSpeed offloads
    out["host_bytes"] = e.step.host_bytes.into();
    if e.step.paged_bytes > 0 {
        out["paged_bytes"] = e.step.paged_bytes.into();
    }
    if let Some(tokens) = image_tokens(state) {
        // per sample: the placeholders the image features replace, the processor's markup,
        // and the language model's whole sequence
        out["image_tokens"] = tokens.image_tokens.into();
        out["image_markup_tokens"] = tokens.markup_tokens.into();
        out["lm_sequence"] = tokens.sequence.into();
    }
    if let Some(moe) = moe_counts(state) {
        out["active_params"] = moe.active.into();
        out["routed_expert_params"] = moe.routed.into();
    }
    if let Some(v) = e.verdict {
        out["verdict"] = serde_json::json!({
            "fits": v.fits(),
            "needed_bytes": v.needed_bytes,
            "communication_bytes": v.communication_bytes,
            "usable_bytes": v.usable_bytes,
            "capacity_bytes": v.capacity_bytes,
            "bytes_left": v.bytes_left(),
            "bytes_missing": v.bytes_missing(),
        });
    }
    if let Some(m) = e.max_batch {
        out["max_batch"] = match m {
            MaxBatch::Fits(b) => b.into(),
            MaxBatch::NoneFits(_) => serde_json::Value::Null,
        };
    }
    // the longest sequence that fits at the batch given (DPO and GRPO: the completion after
    // the prompt), on a grid of `step` tokens; `tokens` null when not even one step fits
    if let Some(l) = longest {
        out["max_seq"] = serde_json::json!({
            "tokens": l.tokens,
            "batch": l.batch,
            "step": l.step,
            "prompt": l.prompt,
            "at_model_limit": l.at_model_limit(),
        });
    }
    if let Some(p) = e.accumulation {
        out["accumulation"] = serde_json::json!({
            "micro_batch": p.micro_batch,
            "accumulation_steps": p.accumulation_steps,
            "num_gpus": p.num_gpus,
            "global_batch": p.global_batch(),
        });
    }
    out
}

fn readable(e: &Evaluation, state: &PageState, longest: Option<&LongestSequence>) -> String {
    let unit = state.byte_unit;
    let mut out = String::new();
    let fmt = |b: u64| {
        format!(
            "{:>14}  ({} bytes)",
            format_bytes(b, unit),
            group_thousands(b)
        )
    };
    let active = moe_counts(state)
        .map(|moe| format!(" ({} active per token)", group_thousands(moe.active)))
        .unwrap_or_default();
    out.push_str(&format!(
        "parameters        {}{active}\n",
        group_thousands(e.n_params)
    ));
    if state.training.method != Method::Full && state.mode == Mode::Architecture {
        out.push_str(&format!(
            "trainable         {} (the adapters)\n",
            group_thousands(e.step.trainable_params)
        ));
    }
    if let Some(t) = image_tokens(state) {
        out.push_str(&format!(
            "image tokens      {} per sample ({} per image, {} tile(s); + {} markup): {} tokens in the language model\n",
            group_thousands(t.image_tokens),
            group_thousands(t.layout.tokens),
            t.layout.tiles,
            group_thousands(t.markup_tokens),
            group_thousands(t.sequence)
        ));
    }
    let batch_label = if e.per_gpu { "batch per GPU" } else { "batch" };
    out.push_str(&format!("{batch_label:<18}{}\n", e.batch));
    for (kind, bytes) in &e.step.parts {
        out.push_str(&format!("{:<18}{}\n", kind.label(), fmt(*bytes)));
        if *kind == PartKind::Activations {
            for (part, bytes) in &e.step.activation_parts {
                out.push_str(&format!(
                    "  {:<30}{:>12}\n",
                    part.label(),
                    format_bytes(*bytes, unit)
                ));
            }
        }
    }
    let phase = e
        .step
        .peak_phase
        .map(|p| format!(" (in the {} phase)", p.label().to_lowercase()))
        .unwrap_or_default();
    let stage = e
        .step
        .stage
        .map(|i| format!(", pipeline stage {} of {}", i + 1, e.plan.pipeline_parallel))
        .unwrap_or_default();
    out.push_str(&format!(
        "{:<18}{}{phase}{stage}\n",
        if e.per_gpu { "peak per GPU" } else { "peak" },
        fmt(e.step.peak_bytes)
    ));
    if let Some(p) = e.step.objective_phases {
        for (name, bytes) in [
            ("generation", p.generation_bytes),
            ("scoring", p.scoring_bytes),
            ("training", Some(p.training_bytes)),
        ] {
            let mark = if p.peak.key() == name {
                "  <- peak"
            } else {
                ""
            };
            let figure = bytes.map_or_else(|| "does not run".to_owned(), fmt);
            out.push_str(&format!("  {name:<16}{figure}{mark}\n"));
        }
    }
    out.push_str(&format!(
        "{:<18}{}{}\n",
        "reserved",
        fmt(e.reserved_bytes()),
        if e.allocator.is_some() {
            format!(" (caching allocator replayed, {})", e.plan.allocator.key())
        } else {
            " (the reserve typed)".to_owned()
        }
    ));
    if e.step.host_bytes > 0 {
        out.push_str(&format!(
            "host RAM per GPU  {} (what is offloaded)\n",
            fmt(e.step.host_bytes)
        ));
    }
    if let Some(v) = e.verdict {
        if v.communication_bytes > 0 {
            out.push_str(&format!(
                "NCCL buffers      {} per GPU (counted in the verdict)\n",
                format_bytes(v.communication_bytes, unit)
            ));
        }
        if v.fits() {
            out.push_str(&format!(
                "verdict           fits, {} left\n",
                format_bytes(v.bytes_left(), unit)
            ));
        } else {
            out.push_str(&format!(
                "verdict           does not fit: {} missing\n",
                format_bytes(v.bytes_missing(), unit)
            ));
        }
    }
    let passes = e.plan.micro_batches_at(e.batch);
    if passes > 1 && e.step.trainable_params > 0 {
        out.push_str(&format!(
            "passes            {passes} of {} per GPU (accumulation: every gradient alive from the second on)\n",
            e.batch
        ));
    }
    match e.max_batch {
        Some(MaxBatch::Fits(b)) => out.push_str(&format!("largest batch     {b}\n")),
        Some(MaxBatch::NoneFits(_)) => {
            out.push_str("largest batch     none: even batch 1 does not fit\n")
        }
        None => {}
    }
    if let Some(l) = longest {
        out.push_str(&longest_line(l));
    }
    if let Some(p) = e.accumulation {
        out.push_str(&format!(
            "accumulation      {} per GPU x {} steps x {} GPUs = {}\n",
            p.micro_batch,
            p.accumulation_steps,
            p.num_gpus,
            p.global_batch()
        ));
    }
    out
}

/// The longest sequence line of the readable output.
fn longest_line(l: &LongestSequence) -> String {
    let what = if l.prompt.is_some() {
        "completion tokens"
    } else {
        "tokens"
    };
    let after = l
        .prompt
        .map(|p| format!(" after the {}-token prompt", group_thousands(p)))
        .unwrap_or_default();
    match l.tokens {
        Some(t) => format!(
            "longest sequence  {} {what}{after} at batch {}{}\n",
            group_thousands(t),
            l.batch,
            if l.at_model_limit() {
                " (the most positions the model takes)"
            } else {
                ""
            }
        ),
        None => format!(
            "longest sequence  none at batch {}: not even {} {what}{after} fit\n",
            l.batch, l.step
        ),
    }
}

/// The largest batch of a plan as a number, 0 when none fits.
fn max_batch_number(m: MaxBatch) -> u64 {
    match m {
        MaxBatch::Fits(b) => b,
        MaxBatch::NoneFits(_) => 0,
    }
}

/// The advisor's plans as JSON: each with its page query, peak, changes, tier and batches.
fn plans_json(plans: &[FitPlan]) -> serde_json::Value {
    plans
        .iter()
        .map(|plan| {
            serde_json::json!({
                "query": encode_query(&plan.state),
                "peak_bytes": plan.peak_bytes,
                "changes": plan.changes.iter().map(Change::label).collect::<Vec<_>>(),
                "tier": plan.rank.tier.label(),
                "more_gpus": plan.rank.more_gpus,
                "gpus": plan.rank.gpus,
                "batch": plan.batch,
                "max_batch": max_batch_number(plan.max_batch),
            })
        })
        .collect()
}

/// `text` wrapped to lines of at most 90 characters, the first after `prefix`, the others
/// indented as wide as it.
fn prose(text: &str, prefix: &str) -> String {
    let indent = " ".repeat(prefix.len());
    let mut out = String::new();
    let mut line = prefix.to_owned();
    let mut empty = true;
    for word in text.split_whitespace() {
        if !empty && line.len() + 1 + word.len() > 90 {
            out.push_str(&line);
            out.push('\n');
            line.clone_from(&indent);
            empty = true;
        }
        if !empty {
            line.push(' ');
        }
        line.push_str(word);
        empty = false;
    }
    out.push_str(&line);
    out.push('\n');
    out
}

/// The advisor's plans, numbered, for a person.
fn readable_plans(plans: &[FitPlan], unit: ByteUnit) -> String {
    let mut out = String::from("\n");
    match plans {
        [] => {
            out.push_str("advice            nothing the advisor tries fits on this device\n");
            return out;
        }
        [only] if only.changes.is_empty() => {
            out.push_str("advice            the step fits as it is: nothing to change\n");
        }
        _ => out.push_str("advice            what fits on this device, best first\n"),
    }
    for (n, plan) in plans.iter().enumerate() {
        // the plans on the person's GPUs, then those on more, each group under its heading
        if n == 0 || plans[n - 1].rank.more_gpus != plan.rank.more_gpus {
            out.push_str(&format!("  {}\n", plan.group_heading()));
        }
        let heading = if plan.changes.is_empty() {
            "As it is"
        } else {
            plan.rank.tier.label()
        };
        let gpus = if plan.rank.more_gpus {
            format!(", {} GPUs", plan.rank.gpus)
        } else {
            String::new()
        };
        out.push_str(&format!("{:>3}. {heading}{gpus}\n", n + 1));
        for change in &plan.changes {
            out.push_str(&prose(&change.label(), "     - "));
            out.push_str(&prose(&change.cost(), "       "));
        }
        let largest = match plan.max_batch {
            MaxBatch::Fits(b) => b.to_string(),
            MaxBatch::NoneFits(_) => "none".to_owned(),
        };
        out.push_str(&format!(
            "     peak {} at batch {}; largest batch {largest}\n",
            format_bytes(plan.peak_bytes, unit),
            plan.batch
        ));
        if let Some(p) = plan.accumulation {
            out.push_str(&format!(
                "     accumulation {} per GPU x {} steps x {} GPUs = {}\n",
                p.micro_batch,
                p.accumulation_steps,
                p.num_gpus,
                p.global_batch()
            ));
        }
        out.push_str(&format!("     ?{}\n", encode_query(&plan.state)));
    }
    out
}

/// `--json`'s `serving`: vLLM's start-up figures, per GPU.
fn serving_json(s: &Serving) -> serde_json::Value {
    serde_json::json!({
        "kv_cache_tokens": s.kv_cache_tokens,
        "max_concurrency": s.max_concurrency.as_f64(),
        "max_model_len": s.max_model_len,
        "max_model_len_fits": s.max_model_len_fits,
        "largest_max_model_len": s.largest_max_model_len,
        "kv_cache_bytes": s.kv_cache_bytes,
        "available_kv_bytes": s.available_kv_bytes,
        "weights_bytes": s.weights_bytes,
        "activation_bytes": s.activation_bytes,
        "non_torch_bytes": s.non_torch_bytes,
        "encoder_items": s.encoder_items,
        "encoder_budget": s.encoder_budget,
        "encoder_kept_bytes": s.encoder_kept_bytes,
        "cuda_graph_bytes": s.cuda_graph_bytes,
        "cuda_graphs_fit": s.graphs_fit(),
        "headroom_bytes": s.headroom_bytes,
        "requested_bytes": s.requested_bytes,
        "device_total_bytes": s.device_total_bytes,
        "block_size": s.block_size,
        "num_blocks": s.num_blocks,
        "kv_groups": s.kv_groups,
        "layers_per_group": s.layers_per_group,
        "kv_bytes_per_token": s.kv_bytes_per_token,
        "state_bytes_per_request": s.state_bytes_per_request,
        "max_num_seqs": s.max_num_seqs,
        "max_num_batched_tokens": s.max_num_batched_tokens,
        // the same pool at other lengths of request
        "sweep": s.sweep.iter().map(|r| serde_json::json!({
            "max_model_len": r.max_model_len,
            "max_concurrency": r.max_concurrency.as_f64(),
            "fits": r.fits,
        })).collect::<Vec<_>>(),
    })
}

/// What a change is, with its value when it has one.
fn change_text(a: &ServeChange) -> String {
    if a.value == 0 {
        a.label.to_owned()
    } else {
        format!("{} {}", a.label, group_thousands(a.value))
    }
}

/// One change that lets vLLM start, with its fields (named as the CLI's messages name them)
/// and what it gives.
fn advice_json(a: &ServeChange) -> serde_json::Value {
    let fields: serde_json::Map<String, serde_json::Value> = a
        .changes
        .iter()
        .map(|(f, v)| (f.label().to_owned(), v.as_str().into()))
        .collect();
    serde_json::json!({
        "change": change_text(a),
        "fields": fields,
        "kv_cache_tokens": a.serving.kv_cache_tokens,
        "max_concurrency": a.serving.max_concurrency.as_f64(),
    })
}

/// vLLM's start-up as its log would say it, per GPU.
fn readable_serving(s: &Serving, unit: ByteUnit) -> String {
    let b = |bytes: u64| format_bytes(bytes, unit);
    let mut out = format!(
        "vLLM start-up     per GPU, as vLLM v0.11.0 sizes it (GiB = 2^30 in its log)\n\
         device total      {} (gpu_memory_utilization takes {})\n\
         weights           {} (Model loading took {} GiB)\n\
         profile peak      {} (a forward of {} tokens, the sampler over {} requests)\n\
         outside torch     {}\n\
         KV cache          {} available ({} GiB), {} allocated\n\
         KV tokens         {} (GPU KV cache size), {} bytes per token, {} blocks of {}\n\
         concurrency       {} at {} tokens per request\n\
         longest request   {} tokens (max_model_len that fits)\n",
        b(s.device_total_bytes),
        b(s.requested_bytes),
        b(s.weights_bytes),
        vllm_gib(s.weights_bytes),
        b(s.activation_bytes),
        group_thousands(s.max_num_batched_tokens),
        group_thousands(s.max_num_seqs.min(s.max_num_batched_tokens)),
        b(s.non_torch_bytes),
        b(u64::try_from(s.available_kv_bytes).unwrap_or(0)),
        if s.available_kv_bytes < 0 {
            format!("-{}", vllm_gib(s.available_kv_bytes.unsigned_abs()))
        } else {
            vllm_gib(s.available_kv_bytes.unsigned_abs())
        },
        b(s.kv_cache_bytes),
        group_thousands(s.kv_cache_tokens),
        group_thousands(s.kv_bytes_per_token),
        group_thousands(s.num_blocks),
        s.block_size,
        s.max_concurrency,
        group_thousands(s.max_model_len),
        group_thousands(s.largest_max_model_len),
    );
    if s.state_bytes_per_request > 0 {
        out.push_str(&format!(
            "states            {} bytes per request (its linear-attention layers' recurrent states, one page each)\n",
            group_thousands(s.state_bytes_per_request)
        ));
    }
    if s.encoder_items > 0 {
        out.push_str(&format!(
            "image encoder     {} dummy {} in a budget of {} tokens, their features kept: {}\n",
            s.encoder_items,
            if s.encoder_items == 1 {
                "item"
            } else {
                "items"
            },
            group_thousands(s.encoder_budget),
            b(s.encoder_kept_bytes)
        ));
    }
    out.push_str(&format!(
        "CUDA graphs       {} of the {} headroom{}\n",
        b(s.cuda_graph_bytes),
        b(s.headroom_bytes),
        if s.graphs_fit() {
            ""
        } else {
            " (they do not fit: lower gpu_memory_utilization or --enforce-eager)"
        }
    ));
    if s.available_kv_bytes <= 0 {
        out.push_str("verdict           vLLM refuses to start: no memory for the KV cache\n");
    } else if !s.max_model_len_fits {
        out.push_str(&format!(
            "verdict           vLLM refuses to start: one request of {} tokens does not fit (at most {})\n",
            group_thousands(s.max_model_len),
            group_thousands(s.largest_max_model_len)
        ));
    }
    out
}

/// Prints vLLM's start-up and what lets it start.
fn print_serving(s: &Serving, advice: &[ServeChange], options: &Options) {
    let notes = estimator_core::parse_page(&options.state).notes;
    if options.json {
        let mut serving = serving_json(s);
        // what lets vLLM start, when one request does not fit
        serving["advice"] = advice.iter().map(advice_json).collect();
        let out = serde_json::json!({
            "serving": serving,
            "query": encode_query(&options.state),
            "notes": notes,
        });
        println!("{out}");
    } else {
        print!("{}", readable_serving(s, options.state.byte_unit));
        for a in advice {
            println!(
                "what to change    {}: {} tokens, {}",
                change_text(a),
                group_thousands(a.serving.kv_cache_tokens),
                a.serving.max_concurrency
            );
        }
        for note in &notes {
            println!("note              {note}");
        }
    }
}

/// Reports what keeps the inputs from being evaluated, on stderr.
fn report(why: &EvaluationError) {
    match why {
        EvaluationError::Fields(fields) => {
            for (field, message) in fields {
                eprintln!("memest: {}: {message}", field.label());
            }
        }
        other => eprintln!("memest: {other}"),
    }
}

/// The most plans `--advise` lists.
const ADVICE_LIMIT: usize = 12;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut options = match parse_args(&args) {
        Ok(o) => o,
        Err(why) if why.is_empty() => {
            println!("{}", usage());
            return ExitCode::SUCCESS;
        }
        Err(why) => {
            eprintln!("memest: {why}\n\n{}", usage());
            return ExitCode::from(2);
        }
    };
    if let Some((id, revision_given)) = &options.hub {
        match hub::load(id, *revision_given) {
            Ok(loaded) => {
                options.notices.extend(loaded.notices);
                options.state.model.config_json = loaded.text;
            }
            Err(why) => {
                eprintln!("memest: {why}");
                return ExitCode::from(1);
            }
        }
    }
    for notice in &options.notices {
        eprintln!("memest: {notice}");
    }
    // parsed once for the figures and the plans
    let scenario = Scenario::parse(&options.state);
    if let Ok(scenario) = &scenario {
        if let Some(serving) = scenario.serve() {
            let s = match serving {
                Ok(s) => s,
                Err(refused) => {
                    report(&EvaluationError::Fields(vec![refused]));
                    return ExitCode::from(1);
                }
            };
            let advice: Vec<ServeChange> = scenario
                .serve_advice(&options.state, &s)
                .into_iter()
                .map(|(a, _)| a)
                .collect();
            print_serving(&s, &advice, &options);
            return ExitCode::SUCCESS;
        }
    }
    let e = match scenario
        .as_ref()
        .map_err(Clone::clone)
        .and_then(Scenario::evaluate)
    {
        Ok(e) => e,
        Err(why) => {
            report(&why);
            return ExitCode::from(1);
        }
    };
    // the longest sequence that fits at the batch given, with a GPU
    let longest = scenario.as_ref().ok().and_then(Scenario::longest_sequence);
    let plans = if options.advise {
        match scenario.and_then(|s| s.advise(&options.state, ADVICE_LIMIT)) {
            Ok(plans) => Some(plans),
            Err(why) => {
                report(&why);
                return ExitCode::from(1);
            }
        }
    } else {
        None
    };
    // what the page says beside the model (what is not modelled, what is assumed)
    let notes = estimator_core::parse_page(&options.state).notes;
    if options.json {
        let mut out = to_json(&e, &options.state, longest.as_ref());
        if let Some(plans) = &plans {
            out["plans"] = plans_json(plans);
        }
        out["notes"] = serde_json::json!(notes);
        println!("{out}");
    } else {
        print!("{}", readable(&e, &options.state, longest.as_ref()));
        for note in &notes {
            println!("note              {note}");
        }
        if let Some(plans) = &plans {
            print!("{}", readable_plans(plans, options.state.byte_unit));
        }
    }
    ExitCode::SUCCESS
}
