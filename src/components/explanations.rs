//! The page's own explanations: summary, how it works, use cases and FAQ.

use estimator_core::Mode;
use leptos::prelude::*;

/// Static explanations written for this page. `<details>` keeps the FAQ short to scan and
/// usable by keyboard without any script.
/// "How it works" follows the mode the page is in.
#[component]
pub fn Explanations(
    /// The mode of the page: the explanation of the other mode is hidden.
    #[prop(into)]
    mode: Signal<Mode>,
) -> impl IntoView {
    view! {
        <section class="card explanations" aria-labelledby="about-title" data-testid="explanations">
            <h2 id="about-title">"What this page tells you"</h2>
            <p>
                "One training step needs GPU memory for four things: the model's weights, the gradients of those weights, "
                "the optimizer's state (AdamW keeps two numbers per weight) and the activations that the forward pass keeps "
                "for the backward pass. The first three are fixed by the model and the optimizer; only the activations grow "
                "with the batch. This page adds them up, shows where the memory goes and how it grows with the batch size."
            </p>
            <h3>"How it works"</h3>
            <div data-testid="how-simple" hidden=move || mode.get() != Mode::Simple>
                <p>"In the simple mode, from the parameter count and the activation memory you give:"</p>
                <ul>
                    <li>"Weights: parameters × bytes per parameter (4 for FP32, 2 for FP16/BF16, 1 for INT8)."</li>
                    <li>"Gradients: parameters × 4 bytes, because mixed-precision training keeps gradients in FP32; none for inference."</li>
                    <li>"Optimizer states: parameters × 8 bytes for AdamW (two FP32 moments), × 4 for SGD with momentum, none without an optimizer."</li>
                    <li>"Activations: batch size × the activation memory of one sample (0 is allowed: model state only)."</li>
                    <li>"Every figure is an exact integer number of bytes, shown in GB (10⁹ bytes) or GiB (2³⁰ bytes)."</li>
                </ul>
            </div>
            <div data-testid="how-architecture" hidden=move || mode.get() != Mode::Architecture>
                <p>
                    "In the architecture mode everything comes from the model itself: a preset or a Hugging Face "
                    "config.json, the sequence length, precision recipe, optimizer, attention kernel, checkpointing and "
                    "training method (full, LoRA, QLoRA). The page runs the step as PyTorch would, on paper: it counts "
                    "every parameter tensor and every tensor autograd saves, layer by layer and dtype by dtype, rounded as "
                    "the CUDA caching allocator rounds them, and reports the peak of the step: the largest of the forward "
                    "pass, the start of backward and the optimizer step, with what is alive at that moment. Every column "
                    "of the sweep table is taken at that peak, so the columns add up to it."
                </p>
                <p>
                    "It is checked against memory PyTorch really allocated for GPT-2, BERT, Llama, Qwen, Gemma, Phi, "
                    "Mistral, OLMo, ViT and mixtures of experts, with and without LoRA/QLoRA: within 1.3% on every measured "
                    "configuration. For inference the weights can be stored quantized (fp8, int8, int4, nf4, GGUF) and the "
                    "KV cache in a smaller dtype; the device can be a GPU, an Apple Mac's unified memory or the CPU's RAM."
                </p>
                <p>
                    "The trainer matters as much as the model: a plain loop (and HF Trainer) computes the logits of every "
                    "token, upcasts them to fp32 and keeps their log-softmax, which for a small model with a large "
                    "vocabulary is most of the step. TRL's SFTTrainer (chunked_nll from 1.7 to 1.14, a fused head from "
                    "1.15), Liger, Cut Cross-Entropy and torchtune's chunked output each keep less; pick the trainer or "
                    "the loss you run. Packed or padded batches give SDPA a mask in every layer (and its memory-efficient "
                    "kernel); flash_attention_2 never takes a mask. torchtune's optimizer in backward and activation "
                    "offloading are there too. The losses that run on the CPU were measured with the trainers' own code; "
                    "Liger, Cut Cross-Entropy, TRL's fused head, flash-attn and the offloading streams (GPU-only code) are "
                    "derived from their pinned sources and checked against their projects' published figures where "
                    "there are any."
                </p>
            </div>
            <h3>"Use cases"</h3>
            <ul>
                <li>"Choose the largest batch size that fits on a GPU before you launch a run."</li>
                <li>"Compare AdamW with SGD, or FP32 with BF16, for the same model."</li>
                <li>"Share a configuration: the link holds every input, and the table copies into notes or a spreadsheet."</li>
            </ul>
            <h3>"Frequently asked questions"</h3>
            <details>
                <summary>"How is weight memory counted?"</summary>
                <p>
                    "Each parameter is stored once, in the chosen precision: a 7-billion-parameter model in BF16 takes "
                    "7 × 10⁹ × 2 bytes = 14 GB. Tied embeddings (the same matrix used for input and output) count once."
                </p>
            </details>
            <details>
                <summary>"Why do activations grow with the batch size and gradients do not?"</summary>
                <p>
                    "Every sample in a batch runs through the whole network and leaves its own intermediate tensors for the "
                    "backward pass, so activations scale with the number of samples (and with the sequence length). "
                    "There is one gradient per weight, summed over the batch, so gradients only depend on the model."
                </p>
            </details>
            <details>
                <summary>"Why does AdamW need more memory than SGD?"</summary>
                <p>
                    "AdamW keeps a running mean and a running variance of every gradient: two FP32 numbers, 8 bytes, per "
                    "parameter. SGD with momentum keeps one (4 bytes); plain SGD keeps none. For a 7B model that is 56 GB "
                    "against 28 GB."
                </p>
            </details>
            <details>
                <summary>"What does mixed precision change?"</summary>
                <p>
                    "It halves the weights and most activations (16-bit instead of 32-bit), but gradients and optimizer "
                    "states usually stay in FP32, and many recipes keep an FP32 master copy of the weights too. So the "
                    "model's fixed memory shrinks less than half; activations, the part that grows with the batch, shrink most."
                </p>
            </details>
            <details>
                <summary>"Why is the peak not weights + gradients + optimizer + activations?"</summary>
                <p>
                    "Those never all exist at once. At the start of backward the activations are all alive but parameter "
                    "gradients do not exist yet; by the optimizer step the activations are freed and the gradients exist, "
                    "and the step allocates temporaries of its own. The architecture mode computes each moment and reports "
                    "the largest, and which phase it is in."
                </p>
            </details>
            <details>
                <summary>"What are the CUDA context, the allocator reserve and the safety margin?"</summary>
                <p>
                    "The CUDA context is memory the driver and the loaded kernels take on the device before any tensor "
                    "exists (about 300–600 MiB; 500 MiB by default). The allocator reserve is memory PyTorch's caching "
                    "allocator holds in its pools beyond the live tensors, through rounding and fragmentation (a percentage "
                    "of the peak, 5% by default). The safety margin is capacity you keep free for what no estimate sees: "
                    "cuBLAS and cuDNN workspaces, NCCL buffers, a longer batch than usual (15% of the GPU by default). The "
                    "verdict counts all three; edit them to match what you observe."
                </p>
            </details>
            <details>
                <summary>"How do ZeRO, FSDP and tensor parallelism change the figures?"</summary>
                <p>
                    "With several GPUs the figures are per GPU. ZeRO-1 splits the optimizer states across the data-parallel "
                    "GPUs, ZeRO-2 the gradients too, ZeRO-3 (FSDP full shard) the parameters as well, with the largest layer "
                    "gathered whole while it runs. Tensor parallelism splits each layer's weights and most of its activations "
                    "across its group."
                </p>
            </details>
            <details>
                <summary>"How is expert parallelism estimated?"</summary>
                <p>
                    "A mixture of experts routes each token to top-k of its experts; only those parameters are active. "
                    "Expert parallelism spreads the routed experts over a group of GPUs that divides the number of GPUs: "
                    "each GPU keeps 1/EP of the experts' weights, gradients and optimizer states (then sharded by ZeRO over "
                    "the GPUs holding the same experts). Activations per GPU are unchanged: with balanced routing each GPU "
                    "still processes, on average, tokens × top-k rows. The all-to-all buffers are not counted. "
                    "Dense models ignore it."
                </p>
            </details>
            <details>
                <summary>"What does the KV cache hold?"</summary>
                <p>
                    "Keys and values of every token, per layer and key/value head. With latent attention (DeepSeek-V3, "
                    "Moonlight), HF transformers caches the compressed latent instead: kv_lora_rank + qk_rope_head_dim "
                    "numbers per token per layer, re-expanded at each step. A sliding-window layer holds the whole prompt "
                    "after a prefill longer than its window, then window tokens once decoding."
                </p>
            </details>
            <details>
                <summary>"What do LoRA, QLoRA and the 8-bit optimizers change?"</summary>
                <p>
                    "Only the adapters (r × (in + out) per adapted linear, fp32 by peft's default) have gradients and "
                    "optimizer states. A frozen linear keeps no input for backward, but each adapted linear keeps its "
                    "input in the adapters' dtype (its own fp32 copy on a bf16 base) and a tokens × r output; under "
                    "autocast the frozen weights' bf16 copies stay alive. QLoRA stores the base in 4 bits with an absmax "
                    "per block of 64 (8-bit with double quantization), dequantized to bf16 for a moment per matmul; "
                    "prepare_model_for_kbit_training makes the other weights fp32. AdamW 8-bit keeps two 1-byte moments "
                    "per element; the paged variant keeps them in CUDA managed memory, outside PyTorch's allocator: "
                    "shown as its own line and counted in the verdict. Offloaded checkpointing moves the layer inputs "
                    "to CPU memory. All of it was measured with peft 0.21 and bitsandbytes 0.50."
                </p>
            </details>
            <details>
                <summary>"Why does nvidia-smi show more than this page?"</summary>
                <p>
                    "This page counts the tensors PyTorch allocates, what torch.cuda.max_memory_allocated() reports. "
                    "nvidia-smi also shows the CUDA context (about 0.3–0.6 GiB), memory the caching allocator has reserved "
                    "but not handed out, fragmentation, cuBLAS/cuDNN workspaces and NCCL buffers. Add a 15–20% margin "
                    "before you decide that a batch fits."
                </p>
            </details>
        </section>
    }
}
