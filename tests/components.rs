//! Browser tests: mount the components in headless Chromium and read what they render.
#![cfg(target_arch = "wasm32")]

use batch_size_estimator::components::{
    plans_markup, serving_card, serving_markup, serving_tsv, BreakdownCard, BreakdownDetail,
    BreakdownPart, FitAdvice, ModelNotes, SweepTable,
};
use batch_size_estimator::{advise_markup, input_form, App};
use estimator_core::{decode_query, parse_page, ByteUnit, PageState, SweepRow};
use leptos::prelude::*;
use wasm_bindgen::JsCast;
use wasm_bindgen_test::*;

wasm_bindgen_test_configure!(run_in_browser);

/// A fresh element in the document to mount into.
fn container() -> web_sys::HtmlElement {
    let document = document();
    let div = document.create_element("div").unwrap();
    document.body().unwrap().append_child(&div).unwrap();
    div.unchecked_into()
}

fn by_testid(root: &web_sys::HtmlElement, testid: &str) -> web_sys::Element {
    root.query_selector(&format!("[data-testid=\"{testid}\"]"))
        .unwrap()
        .unwrap_or_else(|| panic!("no element with data-testid={testid}"))
}

fn all_by_testid(root: &web_sys::HtmlElement, testid: &str) -> Vec<web_sys::Element> {
    let list = root
        .query_selector_all(&format!("[data-testid=\"{testid}\"]"))
        .unwrap();
    (0..list.length())
        .filter_map(|i| list.item(i))
        .filter_map(|n| n.dyn_into().ok())
        .collect()
}

async fn next_tick() {
    let promise = web_sys::js_sys::Promise::resolve(&wasm_bindgen::JsValue::NULL);
    wasm_bindgen_futures::JsFuture::from(promise).await.unwrap();
}

#[wasm_bindgen_test]
async fn breakdown_card_carries_exact_bytes_and_follows_the_unit() {
    let root = container();
    let unit = RwSignal::new(ByteUnit::Gb);
    let parts = vec![
        BreakdownPart {
            testid: "weights",
            label: "Weights",
            bytes: 14_000_000_000,
            details: Vec::new(),
        },
        BreakdownPart {
            testid: "activations",
            label: "Activations",
            bytes: 4_096_000_000,
            details: Vec::new(),
        },
    ];
    let handle = leptos::mount::mount_to(root.clone(), move || {
        view! {
            <BreakdownCard
                parts=Signal::derive(move || Some(parts.clone()))
                total=Signal::derive(|| Some(18_096_000_000))
                problem=Signal::derive(|| None::<String>)
                unit=unit
                total_label=Signal::derive(|| "Total")
            />
        }
    });
    let total = by_testid(&root, "total");
    assert_eq!(
        total.get_attribute("data-bytes").as_deref(),
        Some("18096000000")
    );
    assert_eq!(total.text_content().unwrap(), "18.10 GB");
    assert_eq!(
        by_testid(&root, "weights")
            .get_attribute("data-bytes")
            .as_deref(),
        Some("14000000000")
    );
    unit.set(ByteUnit::Gib);
    next_tick().await;
    assert_eq!(
        by_testid(&root, "total").text_content().unwrap(),
        "16.85 GiB"
    );
    assert_eq!(
        by_testid(&root, "total")
            .get_attribute("data-bytes")
            .as_deref(),
        Some("18096000000")
    );
    drop(handle);
}

#[wasm_bindgen_test]
async fn breakdown_card_lists_what_the_activations_are_for() {
    let root = container();
    let parts = vec![
        BreakdownPart {
            testid: "weights",
            label: "Weights",
            bytes: 1_000,
            details: Vec::new(),
        },
        BreakdownPart {
            testid: "activations",
            label: "Activations",
            bytes: 3_000_000,
            details: vec![
                BreakdownDetail {
                    key: "attention",
                    label: "Attention (q, k, v, output)",
                    bytes: 2_000_000,
                },
                BreakdownDetail {
                    key: "qk-norms",
                    label: "Q/K norms",
                    bytes: 1_000_000,
                },
            ],
        },
    ];
    let handle = leptos::mount::mount_to(root.clone(), move || {
        view! {
            <BreakdownCard
                parts=Signal::derive(move || Some(parts.clone()))
                total=Signal::derive(|| Some(3_001_000))
                problem=Signal::derive(|| None::<String>)
                unit=Signal::derive(|| ByteUnit::Gb)
                total_label=Signal::derive(|| "Peak")
            />
        }
    });
    let attention = by_testid(&root, "saved-part-attention");
    assert_eq!(
        attention.get_attribute("data-bytes").as_deref(),
        Some("2000000")
    );
    assert_eq!(
        by_testid(&root, "saved-part-qk-norms")
            .get_attribute("data-bytes")
            .as_deref(),
        Some("1000000")
    );
    let list = by_testid(&root, "activations-details");
    assert_eq!(list.child_element_count(), 2);
    assert!(list.text_content().unwrap().contains("Q/K norms"));
    // Only the activations have a sub-list; the categories are unchanged.
    assert!(root
        .query_selector("[data-testid=\"weights-details\"]")
        .unwrap()
        .is_none());
    assert_eq!(
        by_testid(&root, "activations")
            .get_attribute("data-bytes")
            .as_deref(),
        Some("3000000")
    );
    drop(handle);
}

#[wasm_bindgen_test]
async fn model_notes_show_one_item_per_note_and_nothing_without() {
    let root = container();
    let notes = RwSignal::new(vec![
        "Only the language model is estimated.",
        "Eager attention.",
    ]);
    let handle = leptos::mount::mount_to(root.clone(), move || {
        view! { <ModelNotes notes=notes /> }
    });
    let list = by_testid(&root, "model-notes");
    assert_eq!(list.tag_name(), "UL");
    assert_eq!(list.child_element_count(), 2);
    assert!(list
        .text_content()
        .unwrap()
        .contains("Only the language model is estimated."));
    notes.set(Vec::new());
    next_tick().await;
    assert!(list.has_attribute("hidden"));
    assert_eq!(list.child_element_count(), 0);
    drop(handle);
}

#[wasm_bindgen_test]
async fn breakdown_card_explains_a_missing_figure() {
    let root = container();
    let handle = leptos::mount::mount_to(root.clone(), move || {
        view! {
            <BreakdownCard
                parts=Signal::derive(|| None)
                total=Signal::derive(|| None)
                problem=Signal::derive(|| Some("Too large to count.".to_owned()))
                unit=Signal::derive(|| ByteUnit::Gb)
                total_label=Signal::derive(|| "Total")
            />
        }
    });
    let total = by_testid(&root, "total");
    assert_eq!(total.get_attribute("data-bytes"), None);
    assert_eq!(total.text_content().unwrap(), "Too large to count.");
    drop(handle);
}

#[wasm_bindgen_test]
async fn sweep_table_highlights_the_chosen_batch() {
    let root = container();
    let rows: Vec<SweepRow> = estimator_core::sweep(12, 1 << 24, |batch| {
        Ok::<_, ()>(SweepRow {
            batch,
            model_state_bytes: 1_000,
            activation_bytes: batch * 10,
            total_bytes: 1_000 + batch * 10 + 7,
            peak_phase: Some(estimator_core::Phase::Backward),
            is_selected: false,
            fits: Some(batch <= 16),
            tokens: None,
        })
    });
    let handle = leptos::mount::mount_to(root.clone(), move || {
        view! {
            <SweepTable
                rows=Signal::derive(move || rows.clone())
                unit=Signal::derive(|| ByteUnit::Gb)
            />
        }
    });
    let rows = all_by_testid(&root, "sweep-row");
    let batches: Vec<String> = rows
        .iter()
        .map(|r| r.get_attribute("data-batch").unwrap())
        .collect();
    assert_eq!(batches, ["1", "2", "4", "8", "12", "16", "32", "64"]);
    let selected: Vec<String> = rows
        .iter()
        .filter(|r| r.class_list().contains("selected"))
        .map(|r| r.get_attribute("data-batch").unwrap())
        .collect();
    assert_eq!(selected, ["12"]);
    // every column at the peak, the same header as the copies
    let header: Vec<String> = {
        let cells = root.query_selector_all("thead th").unwrap();
        (0..cells.length())
            .map(|i| cells.item(i).unwrap().text_content().unwrap())
            .collect()
    };
    assert_eq!(
        header,
        [
            "Batch Size",
            "Weights + Grad + Opt at peak (GB)",
            "Activations at peak (GB)",
            "Other at peak (GB)",
            "Peak (GB)",
            "Peak in",
            "Fits"
        ]
    );
    let fits = all_by_testid(&root, "sweep-fits");
    assert_eq!(fits.len(), 8);
    assert_eq!(fits[5].text_content().unwrap(), "yes");
    assert_eq!(fits[6].text_content().unwrap(), "no");
    assert!(root
        .query_selector("[data-testid=\"copy-sweep\"]")
        .unwrap()
        .is_some());
    assert!(root
        .query_selector("[data-testid=\"copy-sweep-tsv\"]")
        .unwrap()
        .is_some());
    drop(handle);
}

/// The sweep over sequence lengths: the same table, its first column the tokens, each row
/// carrying its length; the title says what varies.
#[wasm_bindgen_test]
async fn sweep_table_over_sequence_lengths() {
    let root = container();
    let scenario = estimator_core::Scenario::parse(
        &decode_query("m=arch&model=qwen3-0.6b&s=1024&b=2&r=bf16&gpu=rtx4090").state,
    )
    .unwrap();
    let longest = scenario.longest_sequence().unwrap();
    let rows = scenario.sequence_sweep(Some(&longest));
    let handle = leptos::mount::mount_to(root.clone(), move || {
        view! {
            <SweepTable
                rows=Signal::derive(move || rows.clone())
                unit=Signal::derive(|| ByteUnit::Gb)
            />
        }
    });
    let rows = all_by_testid(&root, "sweep-row");
    let lengths: Vec<String> = rows
        .iter()
        .map(|r| r.get_attribute("data-tokens").unwrap())
        .collect();
    assert_eq!(
        lengths,
        ["128", "256", "512", "1024", "2048", "4096", "8192"]
    );
    assert!(rows
        .iter()
        .all(|r| r.get_attribute("data-batch").as_deref() == Some("2")));
    let first = root.query_selector("thead th").unwrap().unwrap();
    assert_eq!(first.text_content().unwrap(), "Sequence Length (tokens)");
    assert_eq!(
        by_testid(&root, "sweep-title").text_content().unwrap(),
        "Sequence Length vs. Memory"
    );
    drop(handle);
}

/// The verdict's longest sequence: its tokens, its batch and the link to the page at it.
#[wasm_bindgen_test]
async fn the_verdict_says_the_longest_sequence_with_its_link() {
    use batch_size_estimator::components::{verdict_card, verdict_markup};
    let root = container();
    let scenario = estimator_core::Scenario::parse(
        &decode_query("m=arch&model=gpt2&s=512&b=1&gpu=h100-80").state,
    )
    .unwrap();
    let e = scenario.evaluate().unwrap();
    let longest = scenario.longest_sequence().unwrap();
    let handle = leptos::mount::mount_to(root.clone(), move || {
        verdict_card(Memo::new(move |_| {
            verdict_markup(Some(&e), ByteUnit::Gb, Some((&longest, "?s=1024")))
        }))
    });
    let line = by_testid(&root, "longest-seq");
    assert_eq!(line.get_attribute("data-tokens").as_deref(), Some("1024"));
    assert_eq!(
        line.text_content().unwrap(),
        "Longest sequence that fits at batch 1: 1,024 tokens (the most positions the model takes)."
    );
    let link = by_testid(&root, "longest-seq-link");
    assert_eq!(link.get_attribute("href").as_deref(), Some("?s=1024"));
    drop(handle);
}

#[wasm_bindgen_test]
async fn the_whole_app_mounts_with_the_default_example() {
    let root = container();
    let handle = leptos::mount::mount_to(root.clone(), App);
    next_tick().await;
    assert_eq!(
        by_testid(&root, "total")
            .get_attribute("data-bytes")
            .as_deref(),
        Some("102096000000")
    );
    assert_eq!(all_by_testid(&root, "sweep-row").len(), 7);
    drop(handle);
}

#[wasm_bindgen_test]
async fn the_app_shows_active_parameters_and_the_expert_parallel_field() {
    use batch_size_estimator::browser;
    // The app opens with the URL's inputs: a mixture of experts over 8 GPUs, 8 expert-parallel.
    browser::replace_query("m=arch&model=qwen3-30b-a3b&s=512&b=1&n=8&ep=8&gpu=none");
    let root = container();
    let handle = leptos::mount::mount_to(root.clone(), App);
    next_tick().await;
    assert_eq!(
        by_testid(&root, "n-params")
            .get_attribute("data-value")
            .as_deref(),
        Some("30532122624")
    );
    let active = by_testid(&root, "active-params");
    assert_eq!(
        active.get_attribute("data-value").as_deref(),
        Some("3353032704")
    );
    assert_eq!(
        active.text_content().unwrap(),
        "(3,353,032,704 active per token)"
    );
    let field: web_sys::HtmlInputElement = by_testid(&root, "expert-parallel").unchecked_into();
    assert_eq!(field.value(), "8");
    assert!(by_testid(&root, "expert-parallel-hint")
        .text_content()
        .unwrap()
        .contains("routed experts"));
    assert_eq!(
        by_testid(&root, "expert-parallel-error")
            .text_content()
            .unwrap(),
        ""
    );
    // A group that does not divide the GPUs: its message, next to the field.
    field.set_value("3");
    field
        .dispatch_event(&web_sys::Event::new("input").unwrap())
        .unwrap();
    next_tick().await;
    assert_eq!(
        by_testid(&root, "expert-parallel-error")
            .text_content()
            .unwrap(),
        "Must divide the data-parallel GPUs (8)."
    );
    assert_eq!(field.get_attribute("aria-invalid").as_deref(), Some("true"));
    // A dense model: no active count, and the hint says the setting does nothing.
    let model: web_sys::HtmlSelectElement = by_testid(&root, "model").unchecked_into();
    model.set_value("qwen3-8b");
    model
        .dispatch_event(&web_sys::Event::new("change").unwrap())
        .unwrap();
    next_tick().await;
    assert!(root
        .query_selector("[data-testid=\"active-params\"]")
        .unwrap()
        .is_none());
    assert!(by_testid(&root, "expert-parallel-hint")
        .text_content()
        .unwrap()
        .contains("no effect"));
    drop(handle);
    // Leave no inputs behind for the other tests of the whole app.
    browser::replace_query("");
    if let Some(storage) = web_sys::window().and_then(|w| w.local_storage().ok().flatten()) {
        let _ = storage.remove_item(browser::STORAGE_KEY);
    }
}

#[wasm_bindgen_test]
async fn fit_advice_links_each_plan() {
    let root = container();
    let state = estimator_core::decode_query("m=arch&model=llama3-8b&gpu=rtx4090&b=1&s=2048").state;
    let plans = estimator_core::fit_advice(&state, 12).unwrap();
    let n = plans.len();
    assert!(n > 1);
    // what the advisor's worker answers for the page's inputs
    let markup = advise_markup(&estimator_core::encode_query(&state));
    assert_eq!(markup, plans_markup(&Ok(plans), state.byte_unit));
    let show = RwSignal::new(false);
    let handle = leptos::mount::mount_to(root.clone(), move || {
        view! {
            <FitAdvice
                plans=RwSignal::new(Some(markup))
                fits_now=Memo::new(|_| false)
                show=show
            />
        }
    });
    let advice = by_testid(&root, "fit-advice");
    let links = advice.query_selector_all("a[href]").unwrap();
    assert_eq!(links.length() as usize, n);
    let items = all_by_testid(&root, "fit-plan");
    assert!(items
        .iter()
        .any(|li| li.text_content().unwrap().contains("QLoRA")));
    let href: web_sys::Element = links.item(0).unwrap().unchecked_into();
    assert!(href.get_attribute("href").unwrap().starts_with("?m=arch"));
    drop(handle);
}

#[wasm_bindgen_test]
async fn the_serving_card_shows_vllm_s_figures_and_the_changes_that_let_it_start() {
    let root = container();
    // Llama 3.1 8B asked for its whole 131k context on a 24 GB card: vLLM refuses
    let state =
        decode_query("m=arch&model=llama3.1-8b&o=none&r=bf16&gpu=rtx4090&srv=on&b=1&s=1024").state;
    let page = parse_page(&state);
    let scenario = page.scenario.as_ref().unwrap();
    let serving = scenario.serve().unwrap();
    let now = serving.as_ref().unwrap();
    assert!(!now.max_model_len_fits);
    let advice = scenario.serve_advice(&state, now);
    assert!(!advice.is_empty());
    let markup = serving_markup(Some(&serving), &advice, ByteUnit::Gib);
    let tsv = serving_tsv(Some(&serving));
    let (tokens, concurrency) = (now.kv_cache_tokens, now.max_concurrency.hundredths());
    let shown = RwSignal::new(markup);
    let handle = leptos::mount::mount_to(root.clone(), move || {
        serving_card(
            Memo::new(move |_| shown.get()),
            Memo::new(move |_| tsv.clone()),
        )
    });
    let card = by_testid(&root, "serving-card");
    assert!(!card.has_attribute("hidden"));
    assert_eq!(
        by_testid(&root, "serve-kv-tokens").get_attribute("data-value"),
        Some(tokens.to_string())
    );
    assert_eq!(
        by_testid(&root, "serve-concurrency").get_attribute("data-value"),
        Some(concurrency.to_string())
    );
    assert!(by_testid(&root, "serve-verdict")
        .text_content()
        .unwrap()
        .starts_with("vLLM refuses to start"));
    // each change is a link to the page with it, which then starts
    let links = by_testid(&root, "serve-advice")
        .query_selector_all("a[href]")
        .unwrap();
    assert_eq!(links.length() as usize, advice.len());
    for i in 0..links.length() {
        let a: web_sys::Element = links.item(i).unwrap().unchecked_into();
        let href = a.get_attribute("href").unwrap();
        let opened = parse_page(&decode_query(href.trim_start_matches('?')).state);
        let started = opened.scenario.unwrap().serve().unwrap().unwrap();
        assert!(started.max_model_len_fits, "{href}");
    }
    // serving off: the card hides
    shown.set(String::new());
    next_tick().await;
    assert!(card.has_attribute("hidden"));
    drop(handle);
}

/// The form the page draws, over the inputs of `query`.
fn mount_form(query: &str) -> (web_sys::HtmlElement, RwSignal<PageState>, impl Drop) {
    let root = container();
    let state = RwSignal::new(decode_query(query).state);
    let page = Memo::new(move |_| state.with(parse_page));
    let handle = leptos::mount::mount_to(root.clone(), move || input_form(state, page));
    (root, state, handle)
}

#[wasm_bindgen_test]
async fn the_form_shows_a_field_s_message_and_reports_typing() {
    let (root, state, handle) = mount_form("b=8&gpu=none");
    next_tick().await;
    assert_eq!(by_testid(&root, "batch-error").text_content().unwrap(), "");
    let input: web_sys::HtmlInputElement = by_testid(&root, "batch").unchecked_into();
    assert_eq!(input.value(), "8");
    input.set_value("2.5");
    input
        .dispatch_event(&web_sys::Event::new("input").unwrap())
        .unwrap();
    next_tick().await;
    assert_eq!(state.with_untracked(|s| s.step.batch.clone()), "2.5");
    assert_eq!(
        by_testid(&root, "batch-error").text_content().unwrap(),
        "Must be a whole number of samples."
    );
    assert_eq!(input.get_attribute("aria-invalid").as_deref(), Some("true"));
    drop(handle);
}

#[wasm_bindgen_test]
async fn the_unsloth_trainer_sets_its_defaults_in_the_form() {
    let (root, state, handle) = mount_form("m=arch&model=llama3.1-8b&gpu=t4");
    next_tick().await;
    let trainer: web_sys::HtmlSelectElement = by_testid(&root, "trainer").unchecked_into();
    trainer.set_value("unsloth");
    trainer
        .dispatch_event(&web_sys::Event::new("change").unwrap())
        .unwrap();
    next_tick().await;
    let (kernels, method) = state.with_untracked(|s| (s.step.kernels, s.training.method));
    assert_eq!(kernels, estimator_core::Kernels::Unsloth);
    assert_eq!(method, estimator_core::Method::Qlora);
    let select = |id: &str| -> String {
        by_testid(&root, id)
            .unchecked_into::<web_sys::HtmlSelectElement>()
            .value()
    };
    assert_eq!(select("kernels"), "unsloth");
    assert_eq!(select("checkpointing"), "offload");
    // a changed default leaves the trainer's name for "custom"
    let kernels: web_sys::HtmlSelectElement = by_testid(&root, "kernels").unchecked_into();
    kernels.set_value("torch");
    kernels
        .dispatch_event(&web_sys::Event::new("change").unwrap())
        .unwrap();
    next_tick().await;
    assert_eq!(
        state.with_untracked(|s| s.step.kernels),
        estimator_core::Kernels::Torch
    );
    assert_eq!(select("trainer"), "custom");
    drop(handle);
}

#[wasm_bindgen_test]
async fn the_hub_id_is_read_on_the_click_only_and_checked_before_any_request() {
    let (root, state, handle) = mount_form("m=arch&gpu=none");
    state.update(|s| s.model.preset = None);
    next_tick().await;
    let before = state.get_untracked();
    let input: web_sys::HtmlInputElement = by_testid(&root, "hub-id").unchecked_into();
    input.set_value("gpt2");
    input
        .dispatch_event(&web_sys::Event::new("input").unwrap())
        .unwrap();
    next_tick().await;
    assert_eq!(
        state.get_untracked(),
        before,
        "typing an id changes nothing"
    );
    assert_eq!(by_testid(&root, "hub-error").text_content().unwrap(), "");
    let button: web_sys::HtmlElement = by_testid(&root, "hub-fetch").unchecked_into();
    assert_eq!(button.get_attribute("type").as_deref(), Some("button"));
    button.click();
    next_tick().await;
    assert_eq!(
        by_testid(&root, "hub-error").text_content().unwrap(),
        "Not a Hub id: write it as owner/name, or owner/name@revision."
    );
    assert!(!button.has_attribute("disabled"), "no request under way");
    assert_eq!(state.get_untracked(), before);
    drop(handle);
}

#[wasm_bindgen_test]
async fn the_form_groups_the_models_and_reports_a_choice() {
    let (root, state, handle) = mount_form("m=arch&model=llama3-8b&gpu=none");
    next_tick().await;
    let model: web_sys::HtmlSelectElement = by_testid(&root, "model").unchecked_into();
    assert_eq!(model.value(), "llama3-8b");
    assert!(model.query_selector_all("optgroup").unwrap().length() > 5);
    let last: web_sys::Element = model.last_element_child().unwrap();
    assert_eq!(last.tag_name(), "OPTION");
    assert_eq!(last.get_attribute("value").as_deref(), Some("custom"));
    let recipe: web_sys::HtmlSelectElement = by_testid(&root, "recipe").unchecked_into();
    recipe.set_value("bf16");
    recipe
        .dispatch_event(&web_sys::Event::new("change").unwrap())
        .unwrap();
    next_tick().await;
    assert_eq!(
        state.with_untracked(|s| s.step.recipe),
        estimator_core::PrecisionRecipe::Bf16
    );
    drop(handle);
}

#[wasm_bindgen_test]
async fn the_form_s_sections_open_when_they_matter() {
    let (root, state, handle) = mount_form("m=arch&model=llama3-8b&gpu=h100-80&gpus=2&tp=2");
    next_tick().await;
    let parallel = by_testid(&root, "fold-parallel");
    assert!(parallel.has_attribute("open"));
    assert!(by_testid(&root, "fold-parallel-note")
        .text_content()
        .unwrap()
        .contains("Tensor parallelism"));
    let overheads = by_testid(&root, "fold-overheads");
    assert!(!overheads.has_attribute("open"));
    assert_eq!(
        by_testid(&root, "fold-overheads-note")
            .text_content()
            .unwrap(),
        "defaults"
    );
    // a change of the state that touches a section opens it and names the field
    state.update(|s| {
        let _ = s.set(estimator_core::Field::SafetyMargin, "20");
    });
    next_tick().await;
    assert!(overheads.has_attribute("open"));
    assert!(by_testid(&root, "fold-overheads-note")
        .text_content()
        .unwrap()
        .contains("Safety margin"));
    drop(handle);
}
