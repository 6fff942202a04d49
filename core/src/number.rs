//! Exact decimal parsing of what people type into number fields.
//!
//! Fields are parsed as decimals (`7`, `0.5`, `1e9`, `7,000`) into integers with no float
//! in between, so `0.1 B` is exactly 100,000,000 and `1e400` is "too large", never `inf`.

use std::fmt;

/// Why a number field was rejected. The message is shown next to the field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FieldError {
    /// Nothing was typed.
    Empty,
    /// The text is not a decimal number.
    NotANumber,
    /// A minus sign: nothing on this page can be negative.
    Negative,
    /// Zero where zero makes no sense.
    Zero,
    /// A fraction where only whole numbers make sense.
    NotWhole {
        /// What the whole number counts (`samples`, `parameters`).
        what: &'static str,
    },
    /// Larger than the field allows.
    TooLarge {
        /// The largest value accepted, as a person would write it.
        max: String,
    },
    /// A message of the field's own (a module name the model lacks, a probability of 1).
    Other(String),
    /// A group size that does not divide what it splits.
    MustDivide {
        /// What it must divide (`the number of GPUs`).
        what: &'static str,
        /// Its value.
        total: u64,
    },
    /// The value must be a multiple of another's.
    MustBeMultiple {
        /// What it must be a multiple of.
        of: &'static str,
        /// Its value.
        factor: u64,
    },
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FieldError::Empty => write!(f, "Enter a number."),
            FieldError::NotANumber => {
                write!(
                    f,
                    "Not a number: use digits, a decimal point or 1e9 notation."
                )
            }
            FieldError::Negative => write!(f, "Must be positive."),
            FieldError::Zero => write!(f, "Must be greater than zero."),
            FieldError::NotWhole { what } => write!(f, "Must be a whole number of {what}."),
            FieldError::TooLarge { max } => write!(f, "Too large: at most {max}."),
            FieldError::Other(message) => f.write_str(message),
            FieldError::MustDivide { what, total } => {
                write!(f, "Must divide {what} ({total}).")
            }
            FieldError::MustBeMultiple { of, factor } => {
                write!(f, "Must be a multiple of {of} ({factor}).")
            }
        }
    }
}

impl std::error::Error for FieldError {}

/// Longest text a number field accepts; anything longer is not a number a person typed.
const MAX_NUMBER_TEXT_LEN: usize = 64;

/// A non-negative decimal `digits x 10^exponent`, exactly as typed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Decimal {
    digits: u128,
    exponent: i32,
}

fn parse_decimal(text: &str) -> Result<Decimal, FieldError> {
    let text = text.trim();
    if text.is_empty() {
        return Err(FieldError::Empty);
    }
    if text.len() > MAX_NUMBER_TEXT_LEN {
        return Err(FieldError::NotANumber);
    }
    let unsigned = match text.strip_prefix('+') {
        Some(rest) => rest,
        None => match text
            .strip_prefix('-')
            .or_else(|| text.strip_prefix('\u{2212}'))
        {
            Some(rest) => {
                // "-0" is still zero, and still not a sensible value: report the sign.
                return match parse_decimal(rest) {
                    Ok(_) => Err(FieldError::Negative),
                    Err(FieldError::Empty) => Err(FieldError::NotANumber),
                    Err(e) => Err(e),
                };
            }
            None => text,
        },
    };
    // (split_once rather than slicing at the index: a str slice's panic path alone pulls
    // the char Debug formatter and its Unicode tables into the bundle)
    let (mantissa, exponent_text) = match unsigned.split_once(['e', 'E']) {
        Some((mantissa, exponent)) => (mantissa, Some(exponent)),
        None => (unsigned, None),
    };
    let mut digits: u128 = 0;
    let mut exponent: i64 = 0;
    let mut seen_digit = false;
    let mut seen_point = false;
    let mut overflowed_digits: i64 = 0;
    for c in mantissa.chars() {
        match c {
            '0'..='9' => {
                seen_digit = true;
                let d = u128::from(c as u8 - b'0');
                match digits.checked_mul(10).and_then(|v| v.checked_add(d)) {
                    Some(v) if overflowed_digits == 0 => {
                        digits = v;
                        if seen_point {
                            exponent -= 1;
                        }
                    }
                    // Past 38 significant digits the value only matters for its size.
                    _ => {
                        if !seen_point {
                            overflowed_digits += 1;
                        }
                    }
                }
            }
            '.' if !seen_point => seen_point = true,
            ',' | '_' if !seen_point && seen_digit => {}
            _ => return Err(FieldError::NotANumber),
        }
    }
    if !seen_digit {
        return Err(FieldError::NotANumber);
    }
    if let Some(exponent_text) = exponent_text {
        let (negative, exponent_digits) = match exponent_text.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (
                false,
                exponent_text.strip_prefix('+').unwrap_or(exponent_text),
            ),
        };
        if exponent_digits.is_empty() || !exponent_digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(FieldError::NotANumber);
        }
        let value = parse_i64(exponent_digits).unwrap_or(i64::from(i32::MAX));
        exponent = exponent.saturating_add(if negative { -value } else { value });
    }
    exponent = exponent.saturating_add(overflowed_digits);
    let mut exponent = i32::try_from(exponent.clamp(-10_000, 10_000)).unwrap_or(0);
    // Drop trailing fractional zeros ("7.000...") so scaling cannot overflow on them.
    while exponent < 0 && digits != 0 && digits.is_multiple_of(10) {
        digits /= 10;
        exponent += 1;
    }
    Ok(Decimal { digits, exponent })
}

/// `text.parse::<u64>().ok()`: an optional `+`, then ASCII digits, without overflow. Written
/// out, as [`parse_i64`], so that the standard library's integer parser stays out of the
/// bundle.
pub(crate) fn parse_u64(text: &str) -> Option<u64> {
    let digits = text.strip_prefix('+').unwrap_or(text);
    if digits.is_empty() {
        return None;
    }
    let mut value: u64 = 0;
    for b in digits.bytes() {
        if !b.is_ascii_digit() {
            return None;
        }
        value = value.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
    }
    Some(value)
}

/// `text.parse::<i64>().ok()`: an optional `+` or `-`, then ASCII digits, without overflow.
pub(crate) fn parse_i64(text: &str) -> Option<i64> {
    let (negative, digits) = match text.strip_prefix('-') {
        Some(digits) => (true, digits),
        None => (false, text.strip_prefix('+').unwrap_or(text)),
    };
    if digits.is_empty() {
        return None;
    }
    let mut value: i64 = 0;
    for b in digits.bytes() {
        if !b.is_ascii_digit() {
            return None;
        }
        let digit = i64::from(b - b'0');
        value = value.checked_mul(10)?;
        value = if negative {
            value.checked_sub(digit)?
        } else {
            value.checked_add(digit)?
        };
    }
    Some(value)
}

/// `value x 10^power`, or `None` past `u128`.
fn times_power_of_ten(value: u128, power: u32) -> Option<u128> {
    if value == 0 {
        return Some(0);
    }
    (0..power).try_fold(value, |v, _| v.checked_mul(10))
}

/// `decimal x scale`, exactly, or `Err` when it is not an integer (`Ok(None)` = too large).
fn scaled_integer(decimal: Decimal, scale: u64) -> Result<Option<u128>, ()> {
    let Some(mut value) = decimal.digits.checked_mul(u128::from(scale)) else {
        return Ok(None);
    };
    if decimal.exponent >= 0 {
        return Ok(times_power_of_ten(value, decimal.exponent.unsigned_abs()));
    }
    for _ in 0..decimal.exponent.unsigned_abs() {
        if value == 0 {
            break;
        }
        if value % 10 != 0 {
            return Err(());
        }
        value /= 10;
    }
    Ok(Some(value))
}

/// Parses a positive whole count of `what`, `text x scale`, in `1..=max`.
///
/// # Errors
/// A [`FieldError`] saying what is wrong with the text.
pub fn parse_whole_count(
    text: &str,
    scale: u64,
    max: u64,
    what: &'static str,
) -> Result<u64, FieldError> {
    let decimal = parse_decimal(text)?;
    let too_large = || FieldError::TooLarge {
        max: crate::bytes::group_thousands(max),
    };
    match scaled_integer(decimal, scale) {
        Err(()) => Err(FieldError::NotWhole { what }),
        Ok(None) => Err(too_large()),
        Ok(Some(0)) => Err(FieldError::Zero),
        Ok(Some(v)) if v > u128::from(max) => Err(too_large()),
        Ok(Some(v)) => u64::try_from(v).map_err(|_| too_large()),
    }
}

/// Parses a positive amount `text x scale`, rounded to the nearest integer, in `1..=max`.
///
/// # Errors
/// A [`FieldError`] saying what is wrong with the text.
pub fn parse_rounded_amount(text: &str, scale: u64, max: u64) -> Result<u64, FieldError> {
    let decimal = parse_decimal(text)?;
    let too_large = || FieldError::TooLarge {
        max: crate::bytes::group_thousands(max),
    };
    let digits_scaled = decimal
        .digits
        .checked_mul(u128::from(scale))
        .ok_or_else(too_large)?;
    let rounded = if decimal.exponent >= 0 {
        times_power_of_ten(digits_scaled, decimal.exponent.unsigned_abs()).ok_or_else(too_large)?
    } else {
        let shift = decimal.exponent.unsigned_abs();
        if shift > 38 {
            0
        } else {
            let divisor = 10u128.pow(shift);
            (digits_scaled + divisor / 2) / divisor
        }
    };
    if decimal.digits == 0 {
        return Err(FieldError::Zero);
    }
    if rounded == 0 {
        // A positive amount below the resolution still rounds to a real (tiny) value.
        return Ok(1);
    }
    if rounded > u128::from(max) {
        return Err(too_large());
    }
    u64::try_from(rounded).map_err(|_| too_large())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[track_caller]
    fn count(text: &str, scale: u64, expected: Result<u64, FieldError>) {
        assert_eq!(
            parse_whole_count(text, scale, 1_000_000_000_000_000, "things"),
            expected,
            "{text:?} x {scale}"
        );
    }

    #[test]
    fn whole_counts() {
        count("7", 1_000_000_000, Ok(7_000_000_000));
        count("7000", 1_000_000, Ok(7_000_000_000));
        count("0.5", 1_000_000_000, Ok(500_000_000));
        count(" 1e9 ", 1, Ok(1_000_000_000));
        count("1.5E3", 1, Ok(1500));
        count("7,000", 1, Ok(7000));
        count("+8", 1, Ok(8));
        count("8.000", 1, Ok(8));
        count("", 1, Err(FieldError::Empty));
        count("   ", 1, Err(FieldError::Empty));
        count("abc", 1, Err(FieldError::NotANumber));
        count("NaN", 1, Err(FieldError::NotANumber));
        count("inf", 1, Err(FieldError::NotANumber));
        count("1e", 1, Err(FieldError::NotANumber));
        count(".", 1, Err(FieldError::NotANumber));
        count("1.2.3", 1, Err(FieldError::NotANumber));
        count("-3", 1, Err(FieldError::Negative));
        count("-0", 1, Err(FieldError::Negative));
        count("0", 1, Err(FieldError::Zero));
        count("0.0", 1_000, Err(FieldError::Zero));
        count("2.5", 1, Err(FieldError::NotWhole { what: "things" }));
        count("1e-400", 1, Err(FieldError::NotWhole { what: "things" }));
        let too_large = Err(FieldError::TooLarge {
            max: "1,000,000,000,000,000".into(),
        });
        count("1e30", 1, too_large.clone());
        count("1e400", 1, too_large.clone());
        count("99999999999999999999999999999999999999999999", 1, too_large);
    }

    #[test]
    fn rounded_amounts() {
        assert_eq!(
            parse_rounded_amount("512", 1_000_000, u64::MAX),
            Ok(512_000_000)
        );
        assert_eq!(
            parse_rounded_amount("0.5", 1_000_000, u64::MAX),
            Ok(500_000)
        );
        assert_eq!(parse_rounded_amount("1e-9", 1_000_000, u64::MAX), Ok(1));
        assert_eq!(
            parse_rounded_amount("0", 1_000_000, u64::MAX),
            Err(FieldError::Zero)
        );
        assert!(matches!(
            parse_rounded_amount("1e400", 1_000_000, u64::MAX),
            Err(FieldError::TooLarge { .. })
        ));
    }

    #[test]
    fn integers_read_as_the_standard_parser_reads_them() {
        for text in [
            "",
            "+",
            "-",
            "0",
            "+0",
            "-0",
            "7",
            "+7",
            "-7",
            "007",
            "12345678901234567890",
            "18446744073709551615",
            "18446744073709551616",
            "9223372036854775807",
            "9223372036854775808",
            "-9223372036854775808",
            "-9223372036854775809",
            "++1",
            "+-1",
            "-+1",
            "--1",
            " 1",
            "1 ",
            "1e3",
            "1.0",
            "١",
            "0x10",
            "\u{2212}1",
        ] {
            assert_eq!(parse_u64(text), text.parse::<u64>().ok(), "{text:?}");
            assert_eq!(parse_i64(text), text.parse::<i64>().ok(), "{text:?}");
        }
    }

    proptest! {
        #[test]
        fn integers_read_as_the_standard_parser_reads_any_text(text in "[-+0-9a ]{0,22}") {
            prop_assert_eq!(parse_u64(&text), text.parse::<u64>().ok());
            prop_assert_eq!(parse_i64(&text), text.parse::<i64>().ok());
        }

        #[test]
        fn never_panics_on_any_text(text in ".{0,80}") {
            let _ = parse_whole_count(&text, 1_000_000_000, u64::MAX, "things");
            let _ = parse_rounded_amount(&text, 1_000_000, u64::MAX);
        }

        #[test]
        fn integers_round_trip(value in 1u64..=u64::MAX) {
            prop_assert_eq!(parse_whole_count(&value.to_string(), 1, u64::MAX, "x"), Ok(value));
            prop_assert_eq!(
                parse_whole_count(&crate::bytes::group_thousands(value), 1, u64::MAX, "x"),
                Ok(value)
            );
        }

        #[test]
        fn within_bounds(text in "[0-9.e+-]{1,20}", max in 1u64..1_000_000) {
            if let Ok(v) = parse_whole_count(&text, 1, max, "x") {
                prop_assert!(v >= 1 && v <= max);
            }
        }
    }
}
