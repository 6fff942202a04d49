//! "Batch Size vs. Memory" as a picture: stacked bars with the GPU's capacity as a line.

use estimator_core::{format_bytes, format_in_unit, ByteUnit, SweepRow};
use leptos::prelude::*;

const WIDTH: u64 = 640;
const HEIGHT: u64 = 300;
const LEFT: u64 = 64;
const RIGHT: u64 = 16;
const TOP: u64 = 16;
const BOTTOM: u64 = 44;
const TICKS: u64 = 4;

/// `value / max` of `span` pixels, with integer arithmetic.
fn scale(value: u64, max: u64, span: u64) -> u64 {
    if max == 0 {
        return 0;
    }
    u64::try_from(u128::from(value) * u128::from(span) / u128::from(max)).unwrap_or(span)
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
    let description = move || {
        let unit = unit.get();
        let mut text = rows.with(|rows| {
            rows.iter()
                .map(|r| format!("batch {}: {}", r.batch, format_bytes(r.total_bytes, unit)))
                .collect::<Vec<_>>()
                .join("; ")
        });
        if let Some(line) = capacity_line.get() {
            text.push_str(&format!(
                ". The largest peak that fits on the GPU is {}.",
                format_bytes(line, unit)
            ));
        }
        text
    };
    let plot = move || {
        let rows = rows.get();
        let unit = unit.get();
        let line = capacity_line.get();
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
        let y = move |bytes: u64| TOP + plot_h - scale(bytes, axis_max, plot_h);
        let ticks = (0..=TICKS)
            .map(|i| {
                let value = i * tick_units * per_unit;
                let ty = y(value);
                view! {
                    <g class="tick">
                        <line x1=LEFT x2=WIDTH - RIGHT y1=ty y2=ty class="grid" />
                        <text x=LEFT - 6 y=ty + 4 text-anchor="end">
                            {format!("{} {}", i * tick_units, unit.symbol())}
                        </text>
                    </g>
                }
            })
            .collect_view();
        let bars = rows
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let x = LEFT + i as u64 * slot + (slot - bar_w) / 2;
                let clip = |b: u64| clip_at.map_or(b, |c| b.min(c));
                let state_top = y(clip(r.model_state_bytes.min(r.total_bytes)));
                let total_top = y(clip(r.total_bytes));
                let base = y(0);
                let over = r.fits == Some(false);
                let clipped = clip_at.is_some_and(|c| r.total_bytes > c);
                let marker = clipped.then(|| {
                    view! {
                        <text class="clip-mark" data-testid="chart-clipped" x=x + bar_w / 2 y=total_top + 12 text-anchor="middle">
                            "\u{2191}"
                        </text>
                    }
                });
                view! {
                    <g class="bar-group" class:selected=r.is_selected class:over=over data-testid="chart-bar" data-batch=r.batch.to_string()>
                        <rect class="chart-state" x=x y=state_top width=bar_w height=base - state_top>
                            <title>{format!("batch {}: model state {}", r.batch, format_bytes(r.model_state_bytes, unit))}</title>
                        </rect>
                        <rect class="chart-activations" x=x y=total_top width=bar_w height=state_top - total_top>
                            <title>{format!("batch {}: peak {}", r.batch, format_bytes(r.total_bytes, unit))}</title>
                        </rect>
                        {marker}
                        <text x=x + bar_w / 2 y=HEIGHT - BOTTOM + 16 text-anchor="middle">{r.batch.to_string()}</text>
                    </g>
                }
            })
            .collect_view();
        let capacity = line.map(|bytes| {
            let ly = y(bytes);
            view! {
                <g class="capacity" data-testid="chart-capacity" data-bytes=bytes.to_string()>
                    <line x1=LEFT x2=WIDTH - RIGHT y1=ly y2=ly />
                    <text x=WIDTH - RIGHT y=ly - 4 text-anchor="end">
                        {format!("Largest peak that fits: {} {}", format_in_unit(bytes, unit), unit.symbol())}
                    </text>
                </g>
            }
        });
        let clip_note = clip_at.map(|c| {
            view! {
                <text class="clip-note" data-testid="chart-clip-note" x=LEFT + 4 y=TOP + 10>
                    {format!("Axis cut at {} {}: taller bars (\u{2191}) are clipped", format_in_unit(c, unit), unit.symbol())}
                </text>
            }
        });
        view! {
            {ticks}
            {bars}
            {capacity}
            {clip_note}
            <text x=LEFT + plot_w / 2 y=HEIGHT - 6 text-anchor="middle" class="axis-label">"Batch size (samples per GPU)"</text>
            <text x=14 y=TOP + plot_h / 2 text-anchor="middle" class="axis-label" transform=format!("rotate(-90 14 {})", TOP + plot_h / 2)>
                {format!("Memory ({})", unit.symbol())}
            </text>
        }
    };
    view! {
        <section class="card chart" aria-labelledby="chart-title">
            <h2 id="chart-title">"Batch Size vs. Memory, as a chart"</h2>
            <svg
                data-testid="memory-chart"
                viewBox=format!("0 0 {WIDTH} {HEIGHT}")
                role="img"
                aria-labelledby="chart-svg-title chart-svg-desc"
            >
                <title id="chart-svg-title">"Peak memory by batch size"</title>
                <desc id="chart-svg-desc">{description}</desc>
                {plot}
            </svg>
            <p class="legend" data-testid="chart-legend">
                <span class="swatch chart-state-swatch"></span>"Weights + gradients + optimizer states "
                <span class="swatch chart-activations-swatch"></span>"Activations and temporaries at the peak "
                <span class="swatch chart-over-swatch"></span><span data-testid="legend-over">"Red: does not fit "</span>
                <span class="legend-line"></span>"Largest peak that fits (capacity minus overheads)"
            </p>
        </section>
    }
}
