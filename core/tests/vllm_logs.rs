//! vLLM's start-up from scratch (model, GPU, settings) against the KV cache its logs printed
//! on real GPUs (`validation/published/vllm-logs.tsv`, quoted with their sources; the whole
//! table is `validation/published/latest-vllm.md`). These rows ran releases 0.8-0.10.2, whose
//! sizing is v0.11.0's, the one the estimator follows.

use estimator_core::{
    parse_hf_config, serve_vllm, Architecture, Gpu, KvDtype, Preset, VllmSettings, WeightFormat,
};

fn model(name: &str) -> Architecture {
    match Preset::from_key(name) {
        Some(p) => p.architecture().expect("preset parses"),
        None => {
            let path = format!(
                "{}/../validation/published/configs/{name}.json",
                env!("CARGO_MANIFEST_DIR")
            );
            parse_hf_config(&std::fs::read_to_string(path).expect("config")).expect("parses")
        }
    }
}

/// One log: its id, the model, the GPU, TP, U (per million), max_model_len,
/// max_num_batched_tokens, the checkpoint's format, FlashInfer's sampler, and the tokens it
/// printed.
struct Log {
    id: &'static str,
    model: &'static str,
    gpu: Gpu,
    tp: u64,
    ppm: u32,
    len: u64,
    batched: Option<u64>,
    format: WeightFormat,
    flashinfer: bool,
    tokens: u64,
}

const fn log(
    id: &'static str,
    model: &'static str,
    gpu: Gpu,
    tp: u64,
    ppm: u32,
    len: u64,
    tokens: u64,
) -> Log {
    Log {
        id,
        model,
        gpu,
        tp,
        ppm,
        len,
        batched: None,
        format: WeightFormat::Recipe,
        flashinfer: false,
        tokens,
    }
}

const QWEN2_7B: &str = "qwen2.5-7b-instruct";

#[test]
fn kv_tokens_within_five_percent_of_the_logs() {
    let logs = [
        Log {
            flashinfer: true,
            ..log("v33", QWEN2_7B, Gpu::A100_80, 1, 250_000, 16_384, 93_872)
        },
        Log {
            flashinfer: true,
            ..log("v34", QWEN2_7B, Gpu::A100_80, 1, 500_000, 16_384, 464_848)
        },
        Log {
            flashinfer: true,
            ..log("v35", QWEN2_7B, Gpu::A100_80, 2, 500_000, 16_384, 1_192_160)
        },
        log("v36", QWEN2_7B, Gpu::A100_40, 2, 500_000, 16_384, 412_944),
        Log {
            flashinfer: true,
            ..log(
                "v37",
                "gpt-oss-120b",
                Gpu::A100_80,
                4,
                800_000,
                16_384,
                2_640_144,
            )
        },
        Log {
            format: WeightFormat::Fp8,
            ..log(
                "v38",
                "qwen3-30b-a3b",
                Gpu::L40s,
                2,
                950_000,
                32_768,
                566_016,
            )
        },
        Log {
            format: WeightFormat::Fp8,
            batched: Some(2048),
            ..log(
                "v39",
                "qwen3-235b-a22b",
                Gpu::L40s,
                8,
                900_000,
                32_768,
                237_344,
            )
        },
        log("v48", QWEN2_7B, Gpu::L40s, 1, 900_000, 32_768, 444_592),
        Log {
            format: WeightFormat::Fp8,
            ..log("v49", QWEN2_7B, Gpu::L40s, 1, 900_000, 32_768, 553_216)
        },
        Log {
            format: WeightFormat::Int4Group128,
            ..log("v50", QWEN2_7B, Gpu::L40s, 1, 900_000, 32_768, 611_248)
        },
        // a Gated DeltaNet + attention hybrid: its states share the pool
        log(
            "v71",
            "qwen3-next-80b-a3b-instruct",
            Gpu::H200,
            2,
            900_000,
            262_144,
            973_760,
        ),
    ];
    for l in logs {
        let s = serve_vllm(
            &model(l.model),
            l.gpu.serve_device(None).expect("a GPU"),
            &VllmSettings {
                utilization_ppm: l.ppm,
                tensor_parallel: l.tp,
                max_model_len: Some(l.len),
                max_num_batched_tokens: l.batched,
                weight_format: l.format,
                kv_dtype: KvDtype::Model,
                flashinfer_sampler: l.flashinfer,
                ..VllmSettings::default()
            },
        )
        .unwrap_or_else(|e| panic!("{}: {e:?}", l.id));
        let error = (s.kv_cache_tokens as f64 - l.tokens as f64) / l.tokens as f64;
        assert!(
            error.abs() <= 0.05,
            "{}: {} tokens against {} logged ({:+.2}%)",
            l.id,
            s.kv_cache_tokens,
            l.tokens,
            error * 100.0
        );
    }
}
