//! "Batch Size vs. Memory" as a picture: stacked bars with the GPU's capacity as a line.

use crate::effect::memo;
use estimator_core::{format_bytes, format_in_unit, ByteUnit, SweepRow};
use leptos::prelude::*;

use crate::markup::{children, text_markup, Markup};

const WIDTH: u64 = 640;
const HEIGHT: u64 = 300;
const LEFT: u64 = 64;
const RIGHT: u64 = 16;
/// Room above the plot for the note that the axis is cut.
const TOP: u64 = 28;
const BOTTOM: u64 = 44;
const TICKS: u64 = 4;

/// `value / max` of `span` pixels, with integer arithmetic.
fn scale(value: u64, max: u64, span: u64) -> u64 {
    if max == 0 {
        return 0;
    }
    u64::try_from(u128::from(value) * u128::from(span) / u128::from(max)).unwrap_or(span)
}

/// The chart's markup, one string per child of the `<svg>`: its title and text alternative, the grid, one stacked bar per row
/// and the capacity line.
pub fn chart_markup(rows: &[SweepRow], line: Option<u64>, unit: ByteUnit) -> Vec<String> {
    let mut m = Markup::default();
    // the sweep over sequence lengths: each bar a length, the batch held
    let seq = rows.iter().any(|r| r.tokens.is_some());
    let name = |r: &SweepRow| match r.tokens {
        Some(t) => format!("{t} tokens"),
        None => format!("batch {}", r.batch),
    };
    m.el(
        "title",
        &[("id", "chart-svg-title")],
        if seq {
            "Peak memory by sequence length"
        } else {
            "Peak memory by batch size"
        },
    );
    let mut description = rows
        .iter()
        .map(|r| format!("{}: {}", name(r), format_bytes(r.total_bytes, unit)))
        .collect::<Vec<_>>()
        .join("; ");
    if let Some(line) = line {
        description.push_str(". The largest peak that fits on the GPU is ");
        description.push_str(&format_bytes(line, unit));
        description.push('.');
    }
    m.el("desc", &[("id", "chart-svg-desc")], &description);

    let tallest = rows
        .iter()
        .map(|r| r.total_bytes.max(r.model_state_bytes))
        .chain(line)
        .max()
        .unwrap_or(0);
    // When large batches dwarf the line, the axis stops at twice the line and taller bars
    // are clipped (marked, with their value in the tooltip and the text alternative).
    let clip_at = line.filter(|l| *l > 0 && tallest / 4 > *l).map(|l| l * 2);
    let max_value = clip_at.unwrap_or(tallest);
    // Headroom above the tallest bar, rounded to a tick of whole units.
    let per_unit = unit.bytes_per_unit();
    let top_units = (max_value / per_unit + 1).max(1);
    let tick_units = top_units.div_ceil(TICKS).max(1);
    let axis_max = tick_units * TICKS * per_unit;
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let n = rows.len().max(1) as u64;
    let slot = plot_w / n;
    let bar_w = slot * 3 / 5;
    let y = |bytes: u64| TOP + plot_h - scale(bytes, axis_max, plot_h);
    let num = |v: u64| v.to_string();
    let symbol = unit.symbol();
    let (left, right) = (num(LEFT), num(WIDTH - RIGHT));
    // the grid as one path and the tick labels as bare texts: the chart is written anew on
    // most changes (the line, and with it the axis, moves with each batch's allocator
    // replay), and the browser's parse of it costs by the element
    let mut grid = String::new();
    for i in 0..=TICKS {
        for part in [
            "M",
            &left,
            " ",
            &num(y(i * tick_units * per_unit)),
            "H",
            &right,
        ] {
            grid.push_str(part);
        }
    }
    m.open("path", &[("d", &grid), ("class", "grid")])
        .close("path");
    for i in 0..=TICKS {
        let ty = y(i * tick_units * per_unit);
        m.el(
            "text",
            &[
                ("x", &num(LEFT - 6)),
                ("y", &num(ty + 4)),
                ("text-anchor", "end"),
            ],
            &format!("{} {symbol}", i * tick_units),
        );
    }
    for (i, r) in rows.iter().enumerate() {
        let x = LEFT + i as u64 * slot + (slot - bar_w) / 2;
        let clip = |b: u64| clip_at.map_or(b, |c| b.min(c));
        let state_top = y(clip(r.model_state_bytes.min(r.total_bytes)));
        let total_top = y(clip(r.total_bytes));
        let base = y(0);
        let over = r.fits == Some(false);
        let clipped = clip_at.is_some_and(|c| r.total_bytes > c);
        let class = match (r.is_selected, over) {
            (false, false) => "bar-group",
            (true, false) => "bar-group selected",
            (false, true) => "bar-group over",
            (true, true) => "bar-group selected over",
        };
        let (x_attr, w_attr, batch) = (num(x), num(bar_w), num(r.swept()));
        let middle = num(x + bar_w / 2);
        m.open(
            "g",
            &[
                ("class", class),
                ("data-testid", "chart-bar"),
                (if seq { "data-tokens" } else { "data-batch" }, &batch),
            ],
        )
        // one tooltip for the bar (one element fewer per bar than one per part)
        .el(
            "title",
            &[],
            &format!(
                "{}: peak {}, model state {}",
                name(r),
                format_bytes(r.total_bytes, unit),
                format_bytes(r.model_state_bytes, unit)
            ),
        )
        .open(
            "rect",
            &[
                ("class", "chart-state"),
                ("x", &x_attr),
                ("y", &num(state_top)),
                ("width", &w_attr),
                ("height", &num(base - state_top)),
            ],
        )
        .close("rect")
        .open(
            "rect",
            &[
                ("class", "chart-activations"),
                ("x", &x_attr),
                ("y", &num(total_top)),
                ("width", &w_attr),
                ("height", &num(state_top - total_top)),
            ],
        )
        .close("rect");
        // a clipped bar says its value, and how far it is above the line
        if clipped {
            m.el(
                "text",
                &[
                    ("class", "clip-mark"),
                    ("data-testid", "chart-clipped"),
                    ("data-bytes", &num(r.total_bytes)),
                    ("x", &middle),
                    ("y", &num(total_top + 12)),
                    ("text-anchor", "middle"),
                ],
                &format!("\u{2191}{}", format_in_unit(r.total_bytes, unit)),
            );
            if let Some(l) = line {
                m.el(
                    "text",
                    &[
                        ("class", "clip-over"),
                        ("data-testid", "chart-clipped-over"),
                        ("data-bytes", &num(r.total_bytes.saturating_sub(l))),
                        ("x", &middle),
                        ("y", &num(total_top + 24)),
                        ("text-anchor", "middle"),
                    ],
                    &format!("+{}", format_in_unit(r.total_bytes.saturating_sub(l), unit)),
                );
            }
        }
        m.el(
            "text",
            &[
                ("x", &middle),
                ("y", &num(HEIGHT - BOTTOM + 16)),
                ("text-anchor", "middle"),
            ],
            &batch,
        )
        .close("g");
    }
    if let Some(bytes) = line {
        let ly = num(y(bytes));
        m.open(
            "g",
            &[
                ("class", "capacity"),
                ("data-testid", "chart-capacity"),
                ("data-bytes", &num(bytes)),
            ],
        )
        .open(
            "line",
            &[("x1", &left), ("x2", &right), ("y1", &ly), ("y2", &ly)],
        )
        .close("line")
        .el(
            "text",
            &[
                ("x", &right),
                ("y", &num(y(bytes) - 4)),
                ("text-anchor", "end"),
            ],
            &format!(
                "Largest peak that fits: {} {symbol}",
                format_in_unit(bytes, unit)
            ),
        )
        .close("g");
    }
    if let Some(c) = clip_at {
        m.el(
            "text",
            &[
                ("class", "clip-note"),
                ("data-testid", "chart-clip-note"),
                ("x", &num(LEFT)),
                ("y", &num(TOP - 10)),
            ],
            &format!(
                "Axis cut at {} {symbol}: taller bars (\u{2191}) are clipped",
                format_in_unit(c, unit)
            ),
        );
    }
    m.el(
        "text",
        &[
            ("x", &num(LEFT + plot_w / 2)),
            ("y", &num(HEIGHT - 6)),
            ("text-anchor", "middle"),
            ("class", "axis-label"),
        ],
        if seq {
            "Sequence length (tokens, the batch held)"
        } else {
            "Batch size (samples per GPU)"
        },
    );
    let middle = TOP + plot_h / 2;
    m.el(
        "text",
        &[
            ("x", "14"),
            ("y", &num(middle)),
            ("text-anchor", "middle"),
            ("class", "axis-label"),
            ("transform", &format!("rotate(-90 14 {middle})")),
        ],
        &format!("Memory ({symbol})"),
    );
    m.pieces()
}

/// Stacked bars of model state and activations per batch, drawn as SVG by the app itself,
/// with the largest peak that fits on the chosen GPU as a dashed line.
#[component]
pub fn MemoryChart(
    /// The sweep rows to draw.
    #[prop(into)]
    rows: Signal<Vec<SweepRow>>,
    /// The largest peak that fits on the GPU, if one is chosen.
    #[prop(into)]
    capacity_line: Signal<Option<u64>>,
    /// The unit of the axis.
    #[prop(into)]
    unit: Signal<ByteUnit>,
) -> impl IntoView {
    memory_chart(
        memo(move |_| rows.with(|rows| chart_markup(rows, capacity_line.get(), unit.get()))),
        memo(move |_| rows.with(|r| r.iter().any(|r| r.tokens.is_some()))),
    )
}

/// The chart card around its markup ([`chart_markup`]); `seq`: the bars are the sweep over
/// sequence lengths.
pub fn memory_chart(chart: Memo<Vec<String>>, seq: Memo<bool>) -> impl IntoView {
    let title = memo(move |_| {
        text_markup(if seq.get() {
            "Sequence Length vs. Memory, as a chart"
        } else {
            "Batch Size vs. Memory, as a chart"
        })
    });
    view! {
        <section class="card chart" aria-labelledby="chart-title">
            <h2 id="chart-title" inner_html=title></h2>
            <svg
                data-testid="memory-chart"
                viewBox="0 0 640 300"
                role="img"
                aria-labelledby="chart-svg-title chart-svg-desc"
                use:children=chart
            ></svg>
            <p class="legend" data-testid="chart-legend">
                <span class="swatch chart-state-swatch"></span>"Weights + gradients + optimizer states "
                <span class="swatch chart-activations-swatch"></span>"Activations and temporaries at the peak "
                <span class="swatch chart-over-swatch"></span><span data-testid="legend-over">"Red: does not fit "</span>
                <span class="legend-line"></span>"Largest peak that fits (capacity minus overheads)"
            </p>
        </section>
    }
}
