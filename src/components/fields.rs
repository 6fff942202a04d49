//! Labelled form controls that show their own validation message.
//!
//! The page draws its own form from data tables as the same markup (`form.rs`, one
//! listener for all fields); these components draw one control each, for views that want one.

use leptos::prelude::*;

/// A labelled text field for a number, with its error message right below it.
///
/// The input is `type="text"` with a decimal keyboard so that whatever is typed stays
/// visible and gets a message, instead of being silently dropped by the browser.
#[component]
pub fn NumberField(
    /// The visible label.
    #[prop(into)]
    label: Signal<&'static str>,
    /// `id` of the input and its `data-testid`.
    testid: &'static str,
    /// The text in the field.
    #[prop(into)]
    value: Signal<String>,
    /// Called with the new text on every keystroke.
    on_input: Callback<String>,
    /// The message to show when the text is not valid.
    #[prop(into)]
    error: Signal<Option<String>>,
    /// A short hint below the field (its `data-testid` is `{testid}-hint`).
    #[prop(optional, into)]
    hint: Signal<&'static str>,
    /// Free text (module names) rather than a number: no decimal keyboard.
    #[prop(optional)]
    text: bool,
) -> impl IntoView {
    let error_id = format!("{testid}-error");
    let hint_id = format!("{testid}-hint");
    let described_by = {
        let error_id = error_id.clone();
        let hint_id = hint_id.clone();
        move || {
            if error.with(Option::is_some) {
                error_id.clone()
            } else {
                hint_id.clone()
            }
        }
    };
    view! {
        <div class="field" class:invalid=move || error.with(Option::is_some)>
            <label for=testid>{move || label.get()}</label>
            <input
                id=testid
                data-testid=testid
                type="text"
                inputmode=if text { "text" } else { "decimal" }
                maxlength="64"
                autocomplete="off"
                spellcheck="false"
                prop:value=move || value.get()
                aria-invalid=move || if error.with(Option::is_some) { "true" } else { "false" }
                aria-describedby=described_by
                on:input=move |ev| on_input.run(event_target_value(&ev))
            />
            <span class="hint" id=hint_id.clone() data-testid=hint_id>{move || hint.get()}</span>
            <span class="error" id=error_id data-testid=format!("{testid}-error") role="alert">
                {move || error.get().unwrap_or_default()}
            </span>
        </div>
    }
}

/// Choices of a drop-down under one heading: `(heading, [(key, label)])`.
pub type OptionGroup = (&'static str, Vec<(&'static str, &'static str)>);

/// The `<option>`s of `(key, label)` choices, `key` selected when it is `value`.
fn option_views(
    options: Vec<(&'static str, &'static str)>,
    value: Signal<String>,
) -> impl IntoView {
    options
        .into_iter()
        .map(|(key, text)| {
            view! {
                <option value=key selected=move || value.with(|v| v == key)>
                    {text}
                </option>
            }
        })
        .collect_view()
}

/// A labelled drop-down of fixed choices, each a `(key, label)` pair: first the `groups`
/// (each an `<optgroup>`), then the ungrouped `options`.
#[component]
pub fn SelectField(
    /// The visible label.
    label: &'static str,
    /// `id` of the select and its `data-testid`.
    testid: &'static str,
    /// The choices as `(key, label)`, after any groups.
    options: Vec<(&'static str, &'static str)>,
    /// Choices under headings, listed first.
    #[prop(optional)]
    groups: Vec<OptionGroup>,
    /// The key of the chosen option.
    #[prop(into)]
    value: Signal<String>,
    /// Called with the key of the newly chosen option.
    on_change: Callback<String>,
) -> impl IntoView {
    view! {
        <div class="field">
            <label for=testid>{label}</label>
            <select
                id=testid
                data-testid=testid
                prop:value=move || value.get()
                on:change=move |ev| on_change.run(event_target_value(&ev))
            >
                {groups
                    .into_iter()
                    .map(|(heading, options)| {
                        view! { <optgroup label=heading>{option_views(options, value)}</optgroup> }
                    })
                    .collect_view()}
                {option_views(options, value)}
            </select>
        </div>
    }
}

/// A fieldset of radio buttons, one per `(key, label)` choice; each input's `id` and
/// `data-testid` is `{name}-{key}`.
#[component]
pub fn RadioGroup(
    /// The fieldset's legend.
    legend: &'static str,
    /// The inputs' `name`, and the prefix of their ids.
    name: &'static str,
    /// `data-testid` of the fieldset.
    testid: &'static str,
    /// The choices as `(key, label)`.
    options: Vec<(&'static str, &'static str)>,
    /// The key of the chosen option.
    #[prop(into)]
    value: Signal<String>,
    /// Called with the key of the newly chosen option.
    on_change: Callback<String>,
) -> impl IntoView {
    view! {
        <fieldset class="radio-group" data-testid=testid>
            <legend>{legend}</legend>
            {options
                .into_iter()
                .map(|(key, text)| {
                    let id = format!("{name}-{key}");
                    view! {
                        <label class="radio">
                            <input
                                type="radio"
                                name=name
                                id=id.clone()
                                data-testid=id
                                value=key
                                prop:checked=move || value.with(|v| v == key)
                                on:change=move |_| on_change.run(key.to_owned())
                            />
                            {text}
                        </label>
                    }
                })
                .collect_view()}
        </fieldset>
    }
}
