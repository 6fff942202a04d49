//! "Batch Size vs. Memory": the sweep table with its copy buttons.

use estimator_core::{format_bytes, sweep_markdown, sweep_tsv, ByteUnit, SweepRow};
use leptos::prelude::*;

use super::CopyButton;

/// The sweep table, the chosen batch highlighted, with Markdown and TSV copy buttons.
#[component]
pub fn SweepTable(
    /// The rows, empty while an input is invalid.
    #[prop(into)]
    rows: Signal<Vec<SweepRow>>,
    /// The unit figures are shown in.
    #[prop(into)]
    unit: Signal<ByteUnit>,
    /// Heading of the last column (`Total` or `Peak`).
    #[prop(into)]
    total_label: Signal<&'static str>,
) -> impl IntoView {
    let markdown = Signal::derive(move || rows.with(|r| sweep_markdown(r, unit.get())));
    let tsv = Signal::derive(move || rows.with(|r| sweep_tsv(r, unit.get())));
    let has_fit = move || rows.with(|r| r.iter().any(|row| row.fits.is_some()));
    view! {
        <section class="card sweep" aria-labelledby="sweep-title">
            <div class="card-header">
                <h2 id="sweep-title">"Batch Size vs. Memory"</h2>
                <div class="copy-buttons">
                    <CopyButton label="Copy as Markdown" testid="copy-sweep" text=markdown />
                    <CopyButton label="Copy for spreadsheet (TSV)" testid="copy-sweep-tsv" text=tsv />
                </div>
            </div>
            <div class="table-scroll">
                <table data-testid="sweep-table">
                    <caption class="visually-hidden">
                        "Memory of one training step at batch sizes around the chosen one"
                    </caption>
                    <thead>
                        <tr>
                            <th scope="col">"Batch Size"</th>
                            <th scope="col">"Weights + Grad + Opt"</th>
                            <th scope="col">"Activations"</th>
                            <th scope="col">{move || total_label.get()}</th>
                            <Show when=has_fit>
                                <th scope="col">"Fits"</th>
                            </Show>
                        </tr>
                    </thead>
                    <tbody>
                        {move || {
                            let unit = unit.get();
                            rows.get()
                                .into_iter()
                                .map(|row| {
                                    view! {
                                        <tr
                                            data-testid="sweep-row"
                                            data-batch=row.batch.to_string()
                                            data-total-bytes=row.total_bytes.to_string()
                                            class:selected=row.is_selected
                                            aria-current=if row.is_selected { Some("true") } else { None }
                                        >
                                            <th scope="row">{row.batch.to_string()}</th>
                                            <td>{format_bytes(row.model_state_bytes, unit)}</td>
                                            <td>{format_bytes(row.activation_bytes, unit)}</td>
                                            <td>{format_bytes(row.total_bytes, unit)}</td>
                                            {row
                                                .fits
                                                .map(|fits| {
                                                    view! {
                                                        <td class:fits=fits class:no-fit=!fits data-testid="sweep-fits">
                                                            {if fits { "yes" } else { "no" }}
                                                        </td>
                                                    }
                                                })}
                                        </tr>
                                    }
                                })
                                .collect_view()
                        }}
                    </tbody>
                </table>
            </div>
        </section>
    }
}
