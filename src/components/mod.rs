//! The page's components, one (or a small family) per file.

mod breakdown;
mod chart;
mod copy_button;
mod fit_advice;
mod model_notes;
mod notices;
mod serving;
mod sweep_table;
mod verdict;

pub use breakdown::{
    bar_markup, breakdown_card, rows_markup, total_markup, BreakdownCard, BreakdownDetail,
    BreakdownPart,
};
pub use chart::{chart_markup, memory_chart, MemoryChart};
pub use copy_button::CopyButton;
pub use fit_advice::{plans_markup, FitAdvice};
pub use model_notes::{model_notes, notes_markup, ModelNotes};
pub use notices::Notices;
pub use serving::{serving_card, serving_markup, serving_tsv};
pub use sweep_table::{body_markup, head_markup, sweep_table, SweepTable};
pub use verdict::{verdict_card, verdict_markup, VerdictCard};
