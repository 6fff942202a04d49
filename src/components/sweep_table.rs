//! "Batch Size vs. Memory": the sweep table with its copy buttons.

use estimator_core::{sweep_cells, sweep_header, sweep_markdown, sweep_tsv, ByteUnit, SweepRow};
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
) -> impl IntoView {
    let markdown = Signal::derive(move || rows.with(|r| sweep_markdown(r, unit.get())));
    let tsv = Signal::derive(move || rows.with(|r| sweep_tsv(r, unit.get())));
    view! {
        <section class="card sweep" aria-labelledby="sweep-title">
            <div class="card-header">
                <h2 id="sweep-title">"Batch Size vs. Memory"</h2>
                <div class="copy-buttons">
                    <CopyButton label="Copy as Markdown" testid="copy-sweep" text=markdown />
                    <CopyButton label="Copy for spreadsheet (TSV)" testid="copy-sweep-tsv" text=tsv />
                </div>
            </div>
            <div class="table-scroll" tabindex="0" role="region" aria-labelledby="sweep-title">
                <table data-testid="sweep-table">
                    <caption class="visually-hidden">
                        "Memory of one training step at batch sizes around the chosen one, every column at the peak"
                    </caption>
                    <thead>
                        <tr>
                            {move || {
                                rows.with(|r| sweep_header(r, unit.get()))
                                    .into_iter()
                                    .map(|cell| view! { <th scope="col">{cell}</th> })
                                    .collect_view()
                            }}
                        </tr>
                    </thead>
                    <tbody>
                        {move || {
                            let unit = unit.get();
                            rows.with(|all| {
                                all.iter()
                                    .map(|row| {
                                        let mut figures = sweep_cells(all, row, unit);
                                        let fits = row.fits;
                                        // the last cell is the Fits column, drawn with its class
                                        if fits.is_some() {
                                            figures.pop();
                                        }
                                        let batch = if figures.is_empty() {
                                            String::new()
                                        } else {
                                            figures.remove(0)
                                        };
                                        view! {
                                            <tr
                                                data-testid="sweep-row"
                                                data-batch=row.batch.to_string()
                                                data-total-bytes=row.total_bytes.to_string()
                                                class:selected=row.is_selected
                                                aria-current=if row.is_selected { Some("true") } else { None }
                                            >
                                                <th scope="row">{batch}</th>
                                                {figures.into_iter().map(|c| view! { <td>{c}</td> }).collect_view()}
                                                {fits.map(|fits| view! {
                                                    <td class:fits=fits class:no-fit=!fits data-testid="sweep-fits">
                                                        {if fits { "yes" } else { "no" }}
                                                    </td>
                                                })}
                                            </tr>
                                        }
                                    })
                                    .collect_view()
                            })
                        }}
                    </tbody>
                </table>
            </div>
        </section>
    }
}
