//! The simple mode: weights + gradients + optimizer states + batch x activations per sample.

use crate::number::{parse_rounded_amount, parse_whole_count, FieldError};
use crate::Optimizer;

/// Largest model the page accepts: 100 trillion parameters.
pub const MAX_PARAMS: u64 = 100_000_000_000_000;
/// Largest batch the page accepts: 2^24 samples per step.
pub const MAX_BATCH: u64 = 1 << 24;
/// Largest activation size per sample: 10^7 MB (10 TB).
pub const MAX_ACTIVATION_BYTES_PER_SAMPLE: u64 = 10_000_000_000_000;
/// Bytes in the MB of the activation field (10^6, like GB is 10^9).
pub const BYTES_PER_MB: u64 = 1_000_000;
/// Gradients stay in FP32 whatever the weights' precision (mixed precision).
pub const GRADIENT_BYTES_PER_PARAM: u64 = 4;

/// The multiplier picked beside the parameter count.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum ParamUnit {
    /// A plain count.
    Plain,
    /// Thousands.
    Thousand,
    /// Millions.
    Million,
    /// Billions (10^9).
    #[default]
    Billion,
}

impl ParamUnit {
    /// Every unit, in the order the page lists them.
    pub const ALL: [ParamUnit; 4] = [
        ParamUnit::Plain,
        ParamUnit::Thousand,
        ParamUnit::Million,
        ParamUnit::Billion,
    ];

    /// How many parameters one of this unit is.
    #[must_use]
    pub const fn multiplier(self) -> u64 {
        match self {
            ParamUnit::Plain => 1,
            ParamUnit::Thousand => 1_000,
            ParamUnit::Million => 1_000_000,
            ParamUnit::Billion => 1_000_000_000,
        }
    }

    /// Short stable key used in URLs.
    #[must_use]
    pub const fn key(self) -> &'static str {
        match self {
            ParamUnit::Plain => "1",
            ParamUnit::Thousand => "K",
            ParamUnit::Million => "M",
            ParamUnit::Billion => "B",
        }
    }

    /// Name shown to a person.
    #[must_use]
    pub const fn label(self) -> &'static str {
        match self {
            ParamUnit::Plain => "plain",
            ParamUnit::Thousand => "K (thousand)",
            ParamUnit::Million => "M (million)",
            ParamUnit::Billion => "B (billion)",
        }
    }

    /// The unit whose [`key`](Self::key) is `key` (case-insensitive).
    #[must_use]
    pub fn from_key(key: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|u| u.key().eq_ignore_ascii_case(key))
    }
}

/// Numerical precision of the weights in the simple mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Precision {
    /// 32-bit floats.
    Fp32,
    /// 16-bit floats, FP16 or BF16.
    #[default]
    Half,
    /// 8-bit integers (quantised weights).
    Int8,
}

impl Precision {
    /// Every precision, in the order the page lists them.
    pub const ALL: [Precision; 3] = [Precision::Fp32, Precision::Half, Precision::Int8];

    /// Bytes one weight takes.
    #[must_use]
    pub const fn bytes_per_param(self) -> u64 {
        match self {
            Precision::Fp32 => 4,
            Precision::Half => 2,
            Precision::Int8 => 1,
        }
    }

    /// Short stable key used in URLs.
    #[must_use]
    pub const fn key(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Half => "fp16",
            Precision::Int8 => "int8",
        }
    }

    /// Name shown to a person.
    #[must_use]
    pub const fn label(self) -> &'static str {
        match self {
            Precision::Fp32 => "FP32",
            Precision::Half => "FP16 / BF16",
            Precision::Int8 => "INT8",
        }
    }

    /// The precision whose [`key`](Self::key) is `key` (`bf16` is read as FP16/BF16 too).
    #[must_use]
    pub fn from_key(key: &str) -> Option<Self> {
        if key == "bf16" {
            return Some(Precision::Half);
        }
        Self::ALL.into_iter().find(|p| p.key() == key)
    }
}

/// The optimizers the simple mode offers.
pub const SIMPLE_OPTIMIZERS: [Optimizer; 3] =
    [Optimizer::AdamW, Optimizer::SgdMomentum, Optimizer::None];

/// Validated inputs of the simple mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SimpleInputs {
    /// Number of parameters.
    pub params: u64,
    /// Precision of the weights.
    pub precision: Precision,
    /// Optimizer, or none for inference.
    pub optimizer: Optimizer,
    /// Samples per step.
    pub batch: u64,
    /// Activation bytes one sample keeps.
    pub activation_bytes_per_sample: u64,
}

/// Where the memory of one step goes, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Breakdown {
    /// The weights.
    pub weights: u64,
    /// The gradients.
    pub gradients: u64,
    /// The optimizer states.
    pub optimizer_states: u64,
    /// The activations kept for backward.
    pub activations: u64,
    /// The memory the step needs at its peak (in the simple mode, the sum of the parts).
    pub total: u64,
}

impl Breakdown {
    /// Weights + gradients + optimizer states: what does not depend on the batch.
    #[must_use]
    pub const fn model_state_bytes(&self) -> u64 {
        self.weights
            .saturating_add(self.gradients)
            .saturating_add(self.optimizer_states)
    }
}

/// A figure too large to be a byte count (more than 2^64 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TooLarge;

impl std::fmt::Display for TooLarge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "The memory needed is too large to count (over 18 EB).")
    }
}

impl std::error::Error for TooLarge {}

/// The simple mode's breakdown of one step.
///
/// # Errors
/// [`TooLarge`] when a figure would not fit in 64 bits.
pub fn simple_breakdown(inputs: &SimpleInputs) -> Result<Breakdown, TooLarge> {
    simple_breakdown_at_batch(inputs, inputs.batch)
}

/// The simple mode's breakdown with the batch replaced by `batch` (for sweeps and searches).
///
/// # Errors
/// [`TooLarge`] when a figure would not fit in 64 bits.
pub fn simple_breakdown_at_batch(inputs: &SimpleInputs, batch: u64) -> Result<Breakdown, TooLarge> {
    let p = inputs.params;
    let weights = p
        .checked_mul(inputs.precision.bytes_per_param())
        .ok_or(TooLarge)?;
    let gradients = if inputs.optimizer.trains() {
        p.checked_mul(GRADIENT_BYTES_PER_PARAM).ok_or(TooLarge)?
    } else {
        0
    };
    let optimizer_states = p
        .checked_mul(inputs.optimizer.approximate_state_bytes_per_param())
        .ok_or(TooLarge)?;
    let activations = batch
        .checked_mul(inputs.activation_bytes_per_sample)
        .ok_or(TooLarge)?;
    let total = weights
        .checked_add(gradients)
        .and_then(|t| t.checked_add(optimizer_states))
        .and_then(|t| t.checked_add(activations))
        .ok_or(TooLarge)?;
    Ok(Breakdown {
        weights,
        gradients,
        optimizer_states,
        activations,
        total,
    })
}

/// Parses the parameter field: `text` in `unit`s.
///
/// # Errors
/// A [`FieldError`] to show next to the field.
pub fn parse_params(text: &str, unit: ParamUnit) -> Result<u64, FieldError> {
    parse_whole_count(text, unit.multiplier(), MAX_PARAMS, "parameters")
}

/// Parses the batch-size field.
///
/// # Errors
/// A [`FieldError`] to show next to the field.
pub fn parse_batch(text: &str) -> Result<u64, FieldError> {
    parse_whole_count(text, 1, MAX_BATCH, "samples")
}

/// Parses the activation field (MB per sample) into bytes per sample. Zero is valid: the
/// model state alone (a model whose activations are negligible, or counted elsewhere).
///
/// # Errors
/// A [`FieldError`] to show next to the field.
pub fn parse_activation_mb(text: &str) -> Result<u64, FieldError> {
    match parse_rounded_amount(text, BYTES_PER_MB, MAX_ACTIVATION_BYTES_PER_SAMPLE) {
        Err(FieldError::Zero) => Ok(0),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs(
        params: u64,
        precision: Precision,
        optimizer: Optimizer,
        batch: u64,
        mb: u64,
    ) -> SimpleInputs {
        SimpleInputs {
            params,
            precision,
            optimizer,
            batch,
            activation_bytes_per_sample: mb * BYTES_PER_MB,
        }
    }

    #[test]
    fn the_issue_example() {
        let b = simple_breakdown(&inputs(
            7_000_000_000,
            Precision::Half,
            Optimizer::AdamW,
            8,
            512,
        ))
        .unwrap();
        assert_eq!(b.weights, 14_000_000_000);
        assert_eq!(b.gradients, 28_000_000_000);
        assert_eq!(b.optimizer_states, 56_000_000_000);
        assert_eq!(b.activations, 4_096_000_000);
        assert_eq!(b.total, 102_096_000_000);
    }

    #[track_caller]
    fn check(precision: Precision, optimizer: Optimizer, weights: u64, grads: u64, opt: u64) {
        let b = simple_breakdown(&inputs(1_000, precision, optimizer, 2, 1)).unwrap();
        assert_eq!(
            (b.weights, b.gradients, b.optimizer_states),
            (weights, grads, opt)
        );
        assert_eq!(b.activations, 2_000_000);
        assert_eq!(b.total, weights + grads + opt + 2_000_000);
    }

    #[test]
    fn bytes_per_parameter_by_precision_and_optimizer() {
        check(Precision::Fp32, Optimizer::AdamW, 4_000, 4_000, 8_000);
        check(Precision::Half, Optimizer::SgdMomentum, 2_000, 4_000, 4_000);
        check(Precision::Int8, Optimizer::None, 1_000, 0, 0);
        check(Precision::Fp32, Optimizer::Sgd, 4_000, 4_000, 0);
    }

    #[test]
    fn overflow_is_an_error_not_a_wrap() {
        let huge = inputs(
            MAX_PARAMS,
            Precision::Fp32,
            Optimizer::AdamW,
            MAX_BATCH,
            10_000_000,
        );
        assert_eq!(simple_breakdown(&huge), Err(TooLarge));
    }

    #[test]
    fn field_parsers() {
        assert_eq!(parse_params("7", ParamUnit::Billion), Ok(7_000_000_000));
        assert_eq!(parse_params("7000", ParamUnit::Million), Ok(7_000_000_000));
        assert_eq!(parse_params("0.5", ParamUnit::Billion), Ok(500_000_000));
        assert!(matches!(
            parse_params("1e30", ParamUnit::Plain),
            Err(FieldError::TooLarge { .. })
        ));
        assert_eq!(
            parse_batch("2.5"),
            Err(FieldError::NotWhole { what: "samples" })
        );
        assert!(matches!(
            parse_batch("1000000000000"),
            Err(FieldError::TooLarge { .. })
        ));
        assert_eq!(parse_activation_mb("512"), Ok(512_000_000));
        assert_eq!(parse_activation_mb("-1"), Err(FieldError::Negative));
    }

    #[track_caller]
    fn activation(text: &str, expected: Result<u64, FieldError>) {
        assert_eq!(parse_activation_mb(text), expected, "{text:?}");
    }

    #[test]
    fn zero_activations_are_the_model_state_alone() {
        activation("0", Ok(0));
        activation("0.0", Ok(0));
        activation("0e5", Ok(0));
        activation("-0", Err(FieldError::Negative));
        activation("", Err(FieldError::Empty));
        activation("0.0000001", Ok(1));
        let b = simple_breakdown(&inputs(1_000, Precision::Half, Optimizer::AdamW, 8, 0)).unwrap();
        assert_eq!(b.activations, 0);
        assert_eq!(b.total, b.model_state_bytes());
    }

    #[test]
    fn keys_round_trip() {
        for p in Precision::ALL {
            assert_eq!(Precision::from_key(p.key()), Some(p));
        }
        for u in ParamUnit::ALL {
            assert_eq!(ParamUnit::from_key(u.key()), Some(u));
        }
        for o in Optimizer::ALL {
            assert_eq!(Optimizer::from_key(o.key()), Some(o));
        }
    }
}
