//! "Batch Size vs. Memory": the same model evaluated at several batch sizes.

use crate::bytes::{format_in_unit, ByteUnit};

/// One row of the sweep table, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SweepRow {
    /// Samples per step.
    pub batch: u64,
    /// Weights + gradients + optimizer states (does not grow with the batch).
    pub model_state_bytes: u64,
    /// Activations (grow with the batch).
    pub activation_bytes: u64,
    /// Peak memory of the step at this batch.
    pub total_bytes: u64,
    /// Whether this is the batch the person chose.
    pub is_selected: bool,
    /// Whether it fits on the chosen GPU, where one is chosen.
    pub fits: Option<bool>,
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

fn header(unit: ByteUnit, with_fit: bool) -> Vec<String> {
    let symbol = unit.symbol();
    let mut cells = vec![
        "Batch Size".to_owned(),
        format!("Weights + Grad + Opt ({symbol})"),
        format!("Activations ({symbol})"),
        format!("Total ({symbol})"),
    ];
    if with_fit {
        cells.push("Fits".to_owned());
    }
    cells
}

fn fit_cell(fits: Option<bool>) -> String {
    match fits {
        Some(true) => "yes".to_owned(),
        Some(false) => "no".to_owned(),
        None => String::new(),
    }
}

/// The sweep as a Markdown table that reads well pasted into notes.
///
/// The chosen batch is in bold; figures are in `unit`, with the unit in the header.
#[must_use]
pub fn sweep_markdown(rows: &[SweepRow], unit: ByteUnit) -> String {
    let with_fit = rows.iter().any(|r| r.fits.is_some());
    let header = header(unit, with_fit);
    let mut out = format!("| {} |\n", header.join(" | "));
    out.push('|');
    for _ in &header {
        out.push_str(" ---: |");
    }
    out.push('\n');
    for row in rows {
        let mut cells = vec![
            row.batch.to_string(),
            format_in_unit(row.model_state_bytes, unit),
            format_in_unit(row.activation_bytes, unit),
            format_in_unit(row.total_bytes, unit),
        ];
        if with_fit {
            cells.push(fit_cell(row.fits));
        }
        if row.is_selected {
            for cell in &mut cells {
                if !cell.is_empty() {
                    *cell = format!("**{cell}**");
                }
            }
        }
        out.push_str(&format!("| {} |\n", cells.join(" | ")));
    }
    out
}

/// The sweep as tab-separated text that pastes into a spreadsheet, one cell per column.
///
/// Numbers carry no thousands separators so spreadsheets read them as numbers.
#[must_use]
pub fn sweep_tsv(rows: &[SweepRow], unit: ByteUnit) -> String {
    let with_fit = rows.iter().any(|r| r.fits.is_some());
    let mut header = header(unit, with_fit);
    header.push("Selected".to_owned());
    let mut out = header.join("\t");
    out.push('\n');
    for row in rows {
        let plain = |bytes: u64| format_in_unit(bytes, unit).replace(',', "");
        let mut cells = vec![
            row.batch.to_string(),
            plain(row.model_state_bytes),
            plain(row.activation_bytes),
            plain(row.total_bytes),
        ];
        if with_fit {
            cells.push(fit_cell(row.fits));
        }
        cells.push(if row.is_selected { "yes" } else { "" }.to_owned());
        out.push_str(&cells.join("\t"));
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
            is_selected: false,
            fits: None,
        })
    }

    #[test]
    fn markdown_table() {
        let rows = sweep(8, 1 << 24, row);
        let table = sweep_markdown(&rows[2..4], ByteUnit::Gb);
        assert_eq!(
            table,
            "| Batch Size | Weights + Grad + Opt (GB) | Activations (GB) | Total (GB) |\n\
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
            "Batch Size\tWeights + Grad + Opt (GiB)\tActivations (GiB)\tTotal (GiB)\tFits\tSelected\n\
             8\t91.27\t3.81\t95.08\tno\tyes\n"
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
