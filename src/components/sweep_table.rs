//! "Batch Size vs. Memory": the sweep table with its copy buttons.

use crate::effect::memo;
use estimator_core::{sweep_cells, sweep_header, sweep_markdown, sweep_tsv, ByteUnit, SweepRow};
use leptos::prelude::*;

use super::CopyButton;
use crate::markup::{children, text_markup, when, Markup};

/// The header cells of the sweep table.
pub fn head_markup(rows: &[SweepRow], unit: ByteUnit) -> String {
    let mut m = Markup::default();
    for cell in sweep_header(rows, unit) {
        m.el("th", &[("scope", "col")], &cell);
    }
    m.finish()
}

/// The rows of the sweep table, the chosen batch (or length) highlighted, one string per row.
pub fn body_markup(rows: &[SweepRow], unit: ByteUnit) -> Vec<String> {
    let mut m = Markup::default();
    for row in rows {
        let mut figures = sweep_cells(rows, row, unit);
        // the last cell is the Fits column, drawn with its class
        if row.fits.is_some() {
            figures.pop();
        }
        let mut figures = figures.into_iter();
        let batch = figures.next().unwrap_or_default();
        let (batch_attr, total_attr) = (row.batch.to_string(), row.total_bytes.to_string());
        let tokens_attr = row.tokens.map(|t| t.to_string()).unwrap_or_default();
        m.open(
            "tr",
            &[
                ("data-testid", "sweep-row"),
                ("data-batch", &batch_attr),
                (when(row.tokens.is_some(), "data-tokens"), &tokens_attr),
                ("data-total-bytes", &total_attr),
                (when(row.is_selected, "class"), "selected"),
                (when(row.is_selected, "aria-current"), "true"),
            ],
        )
        .el("th", &[("scope", "row")], &batch);
        for cell in figures {
            m.el("td", &[], &cell);
        }
        if let Some(fits) = row.fits {
            m.el(
                "td",
                &[
                    ("class", if fits { "fits" } else { "no-fit" }),
                    ("data-testid", "sweep-fits"),
                ],
                if fits { "yes" } else { "no" },
            );
        }
        m.close("tr");
    }
    m.pieces()
}

/// The sweep table around its markups ([`head_markup`], [`body_markup`]), with buttons that
/// copy `markdown` and `tsv`; `seq`: the rows are the sweep over sequence lengths; `axis`:
/// the control that chooses it.
pub fn sweep_table(
    head: Memo<String>,
    body: Memo<Vec<String>>,
    markdown: Memo<String>,
    tsv: Memo<String>,
    seq: Memo<bool>,
    axis: impl IntoView + 'static,
) -> impl IntoView {
    let title = memo(move |_| {
        text_markup(if seq.get() {
            "Sequence Length vs. Memory"
        } else {
            "Batch Size vs. Memory"
        })
    });
    let caption = memo(move |_| {
        text_markup(if seq.get() {
            "Memory of one training step at sequence lengths around the chosen one, the batch held, every column at the peak"
        } else {
            "Memory of one training step at batch sizes around the chosen one, every column at the peak"
        })
    });
    view! {
        <section class="card sweep" aria-labelledby="sweep-title">
            <div class="card-header">
                <h2 id="sweep-title" data-testid="sweep-title" inner_html=title></h2>
                {axis}
                <div class="copy-buttons">
                    <CopyButton label="Copy as Markdown" testid="copy-sweep" text=markdown />
                    <CopyButton label="Copy for spreadsheet (TSV)" testid="copy-sweep-tsv" text=tsv />
                </div>
            </div>
            <div class="table-scroll" tabindex="0" role="region" aria-labelledby="sweep-title">
                <table data-testid="sweep-table">
                    <caption class="visually-hidden" inner_html=caption></caption>
                    <thead>
                        <tr inner_html=head></tr>
                    </thead>
                    <tbody use:children=body></tbody>
                </table>
            </div>
        </section>
    }
}

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
    sweep_table(
        memo(move |_| rows.with(|r| head_markup(r, unit.get()))),
        memo(move |_| rows.with(|r| body_markup(r, unit.get()))),
        memo(move |_| rows.with(|r| sweep_markdown(r, unit.get()))),
        memo(move |_| rows.with(|r| sweep_tsv(r, unit.get()))),
        memo(move |_| rows.with(|r| r.iter().any(|r| r.tokens.is_some()))),
        (),
    )
}
