//! "Batch Size vs. Memory": the same model evaluated at several batch sizes.

use crate::bytes::{format_in_unit, ByteUnit};
use crate::Phase;

/// What the sweep table varies: the batch (the sequence held) or the sequence length (the
/// batch held). A display setting, in links as `sweep` when it is not the batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum SweepAxis {
    /// Batch sizes around the chosen one.
    #[default]
    Batch,
    /// Sequence lengths around the chosen one (DPO and GRPO: completion lengths).
    Seq,
}

impl SweepAxis {
    /// Both, in the order the page offers them.
    pub const ALL: [SweepAxis; 2] = [SweepAxis::Batch, SweepAxis::Seq];

    /// Short stable key used in URLs.
    #[must_use]
    pub const fn key(self) -> &'static str {
        match self {
            SweepAxis::Batch => "batch",
            SweepAxis::Seq => "seq",
        }
    }

    /// Name shown to a person.
    #[must_use]
    pub const fn label(self) -> &'static str {
        match self {
            SweepAxis::Batch => "Batch size",
            SweepAxis::Seq => "Sequence length",
        }
    }
}

/// One row of the sweep table, in bytes, every column at the same moment: the peak.
///
/// `model_state_bytes + activation_bytes + other_bytes() == total_bytes`. In architecture
/// mode the moment is [`peak_phase`](Self::peak_phase): gradients, for instance, count only
/// when the peak falls where they exist. In simple mode everything is alive at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SweepRow {
    /// Samples per step.
    pub batch: u64,
    /// Weights + gradients + optimizer states alive at the peak.
    pub model_state_bytes: u64,
    /// Activations alive at the peak (grow with the batch).
    pub activation_bytes: u64,
    /// Peak memory of the step at this batch.
    pub total_bytes: u64,
    /// The phase of the peak (architecture mode; `None` in simple mode).
    pub peak_phase: Option<Phase>,
    /// Whether this is the batch the person chose.
    pub is_selected: bool,
    /// Whether it fits on the chosen GPU, where one is chosen.
    pub fits: Option<bool>,
    /// The sweep over sequence lengths: the tokens of each sequence at this row (DPO and
    /// GRPO: the prompt and the completion), the batch held. `None` in the batch sweep.
    pub tokens: Option<u64>,
}

impl SweepRow {
    /// What the row varies: its tokens per sequence in the sweep over sequence lengths, its
    /// batch otherwise.
    #[must_use]
    pub const fn swept(&self) -> u64 {
        match self.tokens {
            Some(tokens) => tokens,
            None => self.batch,
        }
    }
}

impl SweepRow {
    /// Everything else alive at the peak: temporaries, buffers and inputs, the KV cache.
    #[must_use]
    pub const fn other_bytes(&self) -> u64 {
        self.total_bytes
            .saturating_sub(self.model_state_bytes)
            .saturating_sub(self.activation_bytes)
    }
}

/// How many powers of two the sweep shows on each side of the chosen batch.
const POWERS_EACH_SIDE: u32 = 3;

/// The batches of the sweep: powers of two around `selected`, and `selected` itself.
#[must_use]
pub fn sweep_batches(selected: u64, max_batch: u64) -> Vec<u64> {
    let selected = selected.clamp(1, max_batch.max(1));
    let centre = selected.ilog2();
    let low = centre.saturating_sub(POWERS_EACH_SIDE);
    let high = (low + 2 * POWERS_EACH_SIDE).min(63);
    let mut batches: Vec<u64> = (low..=high)
        .map(|power| 1u64 << power)
        .filter(|&b| b <= max_batch)
        .collect();
    // The powers are ascending: `selected` goes in its place unless it is one of them (no
    // general sort, whose code would weigh on the page).
    if let Err(at) = batches.binary_search(&selected) {
        batches.insert(at, selected);
    }
    batches
}

/// Evaluates `estimate` (batch to row) at every batch of [`sweep_batches`].
///
/// Rows whose estimate fails (a figure too large) are left out: the table shows what can
/// be counted.
pub fn sweep<E>(
    selected: u64,
    max_batch: u64,
    mut estimate: impl FnMut(u64) -> Result<SweepRow, E>,
) -> Vec<SweepRow> {
    sweep_batches(selected, max_batch)
        .into_iter()
        .filter_map(|batch| {
            estimate(batch).ok().map(|row| SweepRow {
                is_selected: batch == selected,
                ..row
            })
        })
        .collect()
}

/// Which columns a table has.
#[derive(Clone, Copy)]
struct Columns {
    /// Architecture mode: the moment of the peak varies, so "Other" and "Peak in" columns.
    phases: bool,
    /// A GPU is chosen: a "Fits" column.
    fit: bool,
    /// The sweep over sequence lengths: its first column is the tokens per sequence.
    tokens: bool,
}

impl Columns {
    fn of(rows: &[SweepRow]) -> Self {
        Self {
            phases: rows.iter().any(|r| r.peak_phase.is_some()),
            fit: rows.iter().any(|r| r.fits.is_some()),
            tokens: rows.iter().any(|r| r.tokens.is_some()),
        }
    }

    fn header(self, unit: ByteUnit) -> Vec<String> {
        let symbol = unit.symbol();
        let at = if self.phases { " at peak" } else { "" };
        let mut cells = vec![
            if self.tokens {
                "Sequence Length (tokens)"
            } else {
                "Batch Size"
            }
            .to_owned(),
            format!("Weights + Grad + Opt{at} ({symbol})"),
            format!("Activations{at} ({symbol})"),
        ];
        if self.phases {
            cells.push(format!("Other at peak ({symbol})"));
        }
        cells.push(format!("Peak ({symbol})"));
        if self.phases {
            cells.push("Peak in".to_owned());
        }
        if self.fit {
            cells.push("Fits".to_owned());
        }
        cells
    }

    /// The cells of `row`, figures written by `figure`.
    fn cells(self, row: &SweepRow, figure: impl Fn(u64) -> String) -> Vec<String> {
        let mut cells = vec![
            row.swept().to_string(),
            figure(row.model_state_bytes),
            figure(row.activation_bytes),
        ];
        if self.phases {
            cells.push(figure(row.other_bytes()));
        }
        cells.push(figure(row.total_bytes));
        if self.phases {
            cells.push(row.peak_phase.map_or("", Phase::label).to_owned());
        }
        if self.fit {
            cells.push(fit_cell(row.fits));
        }
        cells
    }
}

/// The header of the sweep table of `rows` as the page and both copies show it: every
/// column at the peak (architecture mode says so, with "Other at peak" and "Peak in").
#[must_use]
pub fn sweep_header(rows: &[SweepRow], unit: ByteUnit) -> Vec<String> {
    Columns::of(rows).header(unit)
}

/// The cells of `row` (one of `rows`) under [`sweep_header`], figures in `unit` without
/// the unit (the header has it).
#[must_use]
pub fn sweep_cells(rows: &[SweepRow], row: &SweepRow, unit: ByteUnit) -> Vec<String> {
    Columns::of(rows).cells(row, |b| format_in_unit(b, unit))
}

fn fit_cell(fits: Option<bool>) -> String {
    match fits {
        Some(true) => "yes".to_owned(),
        Some(false) => "no".to_owned(),
        None => String::new(),
    }
}

/// `parts.join(separator)`, written out: the standard library's `join` is generic and its
/// copy for `String`s served only these tables and the query string.
pub(crate) fn join(parts: &[String], separator: &str) -> String {
    let mut out = String::new();
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            out.push_str(separator);
        }
        out.push_str(part);
    }
    out
}

/// The sweep as a Markdown table that reads well pasted into notes.
///
/// The chosen batch is in bold; figures are in `unit`, with the unit in the header. Every
/// column is taken at the peak; in architecture mode the table says in which phase.
#[must_use]
pub fn sweep_markdown(rows: &[SweepRow], unit: ByteUnit) -> String {
    let columns = Columns::of(rows);
    let header = columns.header(unit);
    let mut out = format!("| {} |\n", join(&header, " | "));
    out.push('|');
    for _ in &header {
        out.push_str(" ---: |");
    }
    out.push('\n');
    for row in rows {
        let mut cells = columns.cells(row, |b| format_in_unit(b, unit));
        if row.is_selected {
            for cell in &mut cells {
                if !cell.is_empty() {
                    *cell = format!("**{cell}**");
                }
            }
        }
        out.push_str(&format!("| {} |\n", join(&cells, " | ")));
    }
    out
}

/// The sweep as tab-separated text that pastes into a spreadsheet, one cell per column.
///
/// Numbers carry no thousands separators so spreadsheets read them as numbers.
#[must_use]
pub fn sweep_tsv(rows: &[SweepRow], unit: ByteUnit) -> String {
    let columns = Columns::of(rows);
    let mut header = columns.header(unit);
    header.push("Selected".to_owned());
    let mut out = join(&header, "\t");
    out.push('\n');
    for row in rows {
        let mut cells = columns.cells(row, |b| format_in_unit(b, unit).replace(',', ""));
        cells.push(if row.is_selected { "yes" } else { "" }.to_owned());
        out.push_str(&join(&cells, "\t"));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[track_caller]
    fn batches(selected: u64, expected: &[u64]) {
        assert_eq!(
            sweep_batches(selected, 1 << 24),
            expected,
            "around {selected}"
        );
    }

    #[test]
    fn powers_of_two_around_the_chosen_batch() {
        batches(8, &[1, 2, 4, 8, 16, 32, 64]);
        batches(1, &[1, 2, 4, 8, 16, 32, 64]);
        batches(12, &[1, 2, 4, 8, 12, 16, 32, 64]);
        batches(1024, &[128, 256, 512, 1024, 2048, 4096, 8192]);
        assert_eq!(
            sweep_batches(1 << 24, 1 << 24),
            [1 << 21, 1 << 22, 1 << 23, 1 << 24]
        );
    }

    fn row(batch: u64) -> Result<SweepRow, ()> {
        Ok(SweepRow {
            batch,
            model_state_bytes: 98_000_000_000,
            activation_bytes: batch * 512_000_000,
            total_bytes: 98_000_000_000 + batch * 512_000_000,
            peak_phase: None,
            is_selected: false,
            fits: None,
            tokens: None,
        })
    }

    #[test]
    fn markdown_table() {
        let rows = sweep(8, 1 << 24, row);
        let table = sweep_markdown(&rows[2..4], ByteUnit::Gb);
        assert_eq!(
            table,
            "| Batch Size | Weights + Grad + Opt (GB) | Activations (GB) | Peak (GB) |\n\
             | ---: | ---: | ---: | ---: |\n\
             | 4 | 98.00 | 2.05 | 100.05 |\n\
             | **8** | **98.00** | **4.10** | **102.10** |\n"
        );
    }

    #[test]
    fn tsv_table() {
        let mut rows = sweep(8, 1 << 24, row);
        rows[3].fits = Some(false);
        let table = sweep_tsv(&rows[3..4], ByteUnit::Gib);
        assert_eq!(
            table,
            "Batch Size\tWeights + Grad + Opt (GiB)\tActivations (GiB)\tPeak (GiB)\tFits\tSelected\n\
             8\t91.27\t3.81\t95.08\tno\tyes\n"
        );
    }

    #[test]
    fn architecture_tables_name_the_moment_of_the_peak() {
        let rows = [
            SweepRow {
                batch: 1,
                model_state_bytes: 6_000_000_000,
                activation_bytes: 0,
                total_bytes: 7_500_000_000,
                peak_phase: Some(Phase::OptimizerStep),
                is_selected: true,
                fits: Some(true),
                tokens: None,
            },
            SweepRow {
                batch: 2,
                model_state_bytes: 4_000_000_000,
                activation_bytes: 3_000_000_000,
                total_bytes: 8_000_000_000,
                peak_phase: Some(Phase::Forward),
                is_selected: false,
                fits: Some(false),
                tokens: None,
            },
        ];
        assert_eq!(rows[0].other_bytes(), 1_500_000_000);
        assert_eq!(
            sweep_markdown(&rows, ByteUnit::Gb),
            "| Batch Size | Weights + Grad + Opt at peak (GB) | Activations at peak (GB) | Other at peak (GB) | Peak (GB) | Peak in | Fits |\n\
             | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n\
             | **1** | **6.00** | **0.00** | **1.50** | **7.50** | **Optimizer step** | **yes** |\n\
             | 2 | 4.00 | 3.00 | 1.00 | 8.00 | Forward | no |\n"
        );
        assert_eq!(
            sweep_tsv(&rows[1..], ByteUnit::Gb),
            "Batch Size\tWeights + Grad + Opt at peak (GB)\tActivations at peak (GB)\tOther at peak (GB)\tPeak (GB)\tPeak in\tFits\tSelected\n\
             2\t4.00\t3.00\t1.00\t8.00\tForward\tno\t\n"
        );
    }

    proptest! {
        #[test]
        fn sweep_contains_selected_once_and_is_sorted(selected in 1u64..(1 << 24)) {
            let b = sweep_batches(selected, 1 << 24);
            prop_assert_eq!(b.iter().filter(|&&x| x == selected).count(), 1);
            prop_assert!(b.windows(2).all(|w| w[0] < w[1]));
            prop_assert!(b.len() >= 4 && b.len() <= 8);
        }
    }
}
