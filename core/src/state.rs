//! Every input of the page, as a person left it: the unit of sharing and storage.

use crate::number::FieldError;
use crate::simple::{parse_activation_mb, parse_batch, parse_params, SimpleInputs};
use crate::{ByteUnit, Optimizer, ParamUnit, Precision};

/// Which way the model is described.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Mode {
    /// Parameter count and activation size per sample, typed in.
    #[default]
    Simple,
    /// Everything derived from the model's architecture.
    Architecture,
}

impl Mode {
    /// Both modes, in the order the page offers them.
    pub const ALL: [Mode; 2] = [Mode::Simple, Mode::Architecture];

    /// Short stable key used in URLs.
    #[must_use]
    pub const fn key(self) -> &'static str {
        match self {
            Mode::Simple => "simple",
            Mode::Architecture => "arch",
        }
    }

    /// Name shown to a person.
    #[must_use]
    pub const fn label(self) -> &'static str {
        match self {
            Mode::Simple => "Simple",
            Mode::Architecture => "From architecture",
        }
    }

    /// The mode whose [`key`](Self::key) is `key`.
    #[must_use]
    pub fn from_key(key: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.key() == key)
    }
}

/// The inputs of the page. Text fields keep exactly what was typed, valid or not, so that a
/// shared link shows the same page; they are parsed where they are used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PageState {
    /// Simple or architecture mode.
    pub mode: Mode,
    /// Parameter count as typed, in [`Self::params_unit`]s.
    pub params: String,
    /// The multiplier of the parameter count.
    pub params_unit: ParamUnit,
    /// Precision of the weights (simple mode).
    pub precision: Precision,
    /// Optimizer.
    pub optimizer: Optimizer,
    /// Batch size as typed.
    pub batch: String,
    /// Activation MB per sample as typed (simple mode).
    pub activation_mb: String,
    /// Unit the figures are shown in.
    pub byte_unit: ByteUnit,
}

impl Default for PageState {
    fn default() -> Self {
        Self {
            mode: Mode::Simple,
            params: "7".to_owned(),
            params_unit: ParamUnit::Billion,
            precision: Precision::Half,
            optimizer: Optimizer::AdamW,
            batch: "8".to_owned(),
            activation_mb: "512".to_owned(),
            byte_unit: ByteUnit::Gb,
        }
    }
}

/// One input of the page, with its URL key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Field {
    /// [`PageState::mode`].
    Mode,
    /// [`PageState::params`].
    Params,
    /// [`PageState::params_unit`].
    ParamsUnit,
    /// [`PageState::precision`].
    Precision,
    /// [`PageState::optimizer`].
    Optimizer,
    /// [`PageState::batch`].
    Batch,
    /// [`PageState::activation_mb`].
    ActivationMb,
    /// [`PageState::byte_unit`].
    ByteUnit,
}

/// Longest text kept for a typed number: longer text is not a number a person typed.
const MAX_TEXT_FIELD_CHARS: usize = 64;

impl Field {
    /// Every field, in the order the URL lists them.
    pub const ALL: [Field; 8] = [
        Field::Mode,
        Field::Params,
        Field::ParamsUnit,
        Field::Precision,
        Field::Optimizer,
        Field::Batch,
        Field::ActivationMb,
        Field::ByteUnit,
    ];

    /// The URL key.
    #[must_use]
    pub const fn key(self) -> &'static str {
        match self {
            Field::Mode => "m",
            Field::Params => "p",
            Field::ParamsUnit => "pu",
            Field::Precision => "pr",
            Field::Optimizer => "o",
            Field::Batch => "b",
            Field::ActivationMb => "a",
            Field::ByteUnit => "u",
        }
    }

    /// What the field is, for notices.
    #[must_use]
    pub const fn label(self) -> &'static str {
        match self {
            Field::Mode => "mode",
            Field::Params => "parameters",
            Field::ParamsUnit => "parameter unit",
            Field::Precision => "precision",
            Field::Optimizer => "optimizer",
            Field::Batch => "batch size",
            Field::ActivationMb => "activation MB per sample",
            Field::ByteUnit => "display unit",
        }
    }

    /// The field whose URL key is `key`.
    #[must_use]
    pub fn from_key(key: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|f| f.key() == key)
    }
}

fn choice<T>(
    value: &str,
    from_key: impl Fn(&str) -> Option<T>,
    keys: &[&str],
) -> Result<T, String> {
    from_key(value).ok_or_else(|| format!("expected one of {}.", keys.join(", ")))
}

fn text(value: &str) -> Result<String, String> {
    if value.chars().count() > MAX_TEXT_FIELD_CHARS {
        return Err(format!("longer than {MAX_TEXT_FIELD_CHARS} characters."));
    }
    Ok(value.to_owned())
}

impl PageState {
    /// The value of `field` as its URL text.
    #[must_use]
    pub fn get(&self, field: Field) -> Option<String> {
        Some(match field {
            Field::Mode => self.mode.key().to_owned(),
            Field::Params => self.params.clone(),
            Field::ParamsUnit => self.params_unit.key().to_owned(),
            Field::Precision => self.precision.key().to_owned(),
            Field::Optimizer => self.optimizer.key().to_owned(),
            Field::Batch => self.batch.clone(),
            Field::ActivationMb => self.activation_mb.clone(),
            Field::ByteUnit => self.byte_unit.key().to_owned(),
        })
    }

    /// Sets `field` from its URL text.
    ///
    /// # Errors
    /// Why the text is not a value of that field; the field is left as it was.
    pub fn set(&mut self, field: Field, value: &str) -> Result<(), String> {
        match field {
            Field::Mode => {
                self.mode = choice(value, Mode::from_key, &Mode::ALL.map(Mode::key))?;
            }
            Field::Params => self.params = text(value)?,
            Field::ParamsUnit => {
                self.params_unit = choice(
                    value,
                    ParamUnit::from_key,
                    &ParamUnit::ALL.map(ParamUnit::key),
                )?;
            }
            Field::Precision => {
                self.precision = choice(
                    value,
                    Precision::from_key,
                    &Precision::ALL.map(Precision::key),
                )?;
            }
            Field::Optimizer => {
                self.optimizer = choice(
                    value,
                    Optimizer::from_key,
                    &Optimizer::ALL.map(Optimizer::key),
                )?;
            }
            Field::Batch => self.batch = text(value)?,
            Field::ActivationMb => self.activation_mb = text(value)?,
            Field::ByteUnit => {
                self.byte_unit =
                    choice(value, ByteUnit::from_key, &ByteUnit::ALL.map(ByteUnit::key))?;
            }
        }
        Ok(())
    }

    /// The typed fields whose text does not parse, with why.
    #[must_use]
    pub fn invalid_text_fields(&self) -> Vec<(Field, FieldError)> {
        let mut invalid = Vec::new();
        if let Err(e) = parse_params(&self.params, self.params_unit) {
            invalid.push((Field::Params, e));
        }
        if let Err(e) = parse_batch(&self.batch) {
            invalid.push((Field::Batch, e));
        }
        if let Err(e) = parse_activation_mb(&self.activation_mb) {
            invalid.push((Field::ActivationMb, e));
        }
        invalid
    }

    /// Puts the default text back into `field`.
    pub fn reset(&mut self, field: Field) {
        let defaults = PageState::default();
        if let Some(value) = defaults.get(field) {
            // The default of every field is valid, so this cannot fail.
            let _ = self.set(field, &value);
        }
    }

    /// The simple mode's inputs, or the error of each field that does not parse.
    ///
    /// # Errors
    /// Every invalid field with its message.
    pub fn simple_inputs(&self) -> Result<SimpleInputs, Vec<(Field, FieldError)>> {
        match (
            parse_params(&self.params, self.params_unit),
            parse_batch(&self.batch),
            parse_activation_mb(&self.activation_mb),
        ) {
            (Ok(params), Ok(batch), Ok(activation_bytes_per_sample)) => Ok(SimpleInputs {
                params,
                precision: self.precision,
                optimizer: self.optimizer,
                batch,
                activation_bytes_per_sample,
            }),
            _ => Err(self.invalid_text_fields()),
        }
    }
}
