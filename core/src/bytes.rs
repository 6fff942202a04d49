//! Byte counts for people: GB (10^9) or GiB (2^30), formatted from integers.

/// The unit a byte count is shown in. Bytes stay integers everywhere else.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum ByteUnit {
    /// Gigabytes, 10^9 bytes, as GPU vendors print capacities.
    #[default]
    Gb,
    /// Gibibytes, 2^30 bytes, as nvidia-smi and PyTorch print memory.
    Gib,
}

impl ByteUnit {
    /// Both units, in the order the page offers them.
    pub const ALL: [ByteUnit; 2] = [ByteUnit::Gb, ByteUnit::Gib];

    /// Bytes in one unit.
    #[must_use]
    pub const fn bytes_per_unit(self) -> u64 {
        match self {
            ByteUnit::Gb => 1_000_000_000,
            ByteUnit::Gib => 1 << 30,
        }
    }

    /// The suffix printed after a number.
    #[must_use]
    pub const fn symbol(self) -> &'static str {
        match self {
            ByteUnit::Gb => "GB",
            ByteUnit::Gib => "GiB",
        }
    }

    /// Short stable key used in URLs.
    #[must_use]
    pub const fn key(self) -> &'static str {
        match self {
            ByteUnit::Gb => "gb",
            ByteUnit::Gib => "gib",
        }
    }

    /// Name shown to a person, with what the unit is.
    #[must_use]
    pub const fn label(self) -> &'static str {
        match self {
            ByteUnit::Gb => "GB (10⁹ bytes)",
            ByteUnit::Gib => "GiB (2³⁰ bytes)",
        }
    }

    /// The unit whose [`key`](Self::key) is `key`.
    #[must_use]
    pub fn from_key(key: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|u| u.key() == key)
    }
}

/// `bytes` in `unit` with two decimals, without the symbol: `102.10`.
///
/// Rounded half up with integer arithmetic, so the figure never depends on float rounding.
#[must_use]
pub fn format_in_unit(bytes: u64, unit: ByteUnit) -> String {
    let divisor = unit.bytes_per_unit();
    // in 64 bits when they hold it (each 128-bit multiply and division is a call in
    // WebAssembly, and a keystroke formats a hundred figures)
    let hundredths = if bytes <= (u64::MAX - divisor / 2) / 100 {
        u128::from((bytes * 100 + divisor / 2) / divisor)
    } else {
        let divisor = u128::from(divisor);
        (u128::from(bytes) * 100 + divisor / 2) / divisor
    };
    let (whole, cents) = match u64::try_from(hundredths) {
        Ok(h) => (u128::from(h / 100), h % 100),
        Err(_) => (hundredths / 100, (hundredths % 100) as u64),
    };
    let mut text = group_digits(whole);
    text.push('.');
    text.extend(digits(u128::from(cents + 100)).skip(1));
    text
}

/// `bytes` in `unit` with two decimals and the symbol: `102.10 GB`.
#[must_use]
pub fn format_bytes(bytes: u64, unit: ByteUnit) -> String {
    format!("{} {}", format_in_unit(bytes, unit), unit.symbol())
}

/// An integer with thin groups of three digits: `102,096,000,000`.
#[must_use]
pub fn group_thousands(value: impl Into<u128>) -> String {
    group_digits(value.into())
}

/// [`group_thousands`], not generic.
fn group_digits(value: u128) -> String {
    let digits: Vec<char> = digits(value).collect();
    let mut grouped = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, &digit) in digits.iter().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            grouped.push(',');
        }
        grouped.push(digit);
    }
    grouped
}

/// The decimal digits of `value`, most significant first: what `value.to_string()` writes,
/// without the formatting machinery of `u128` (about half a kilobyte of WebAssembly).
fn digits(value: u128) -> impl Iterator<Item = char> {
    let mut reversed = Vec::new();
    // the digits beyond 64 bits in 128-bit arithmetic, the rest in 64-bit (each 128-bit
    // division is a call in WebAssembly)
    let mut wide = value;
    let mut narrow = loop {
        if let Ok(narrow) = u64::try_from(wide) {
            break narrow;
        }
        reversed.push(char::from(b'0' + (wide % 10) as u8));
        wide /= 10;
    };
    loop {
        reversed.push(char::from(b'0' + (narrow % 10) as u8));
        narrow /= 10;
        if narrow == 0 {
            break;
        }
    }
    reversed.into_iter().rev()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn check(bytes: u64, unit: ByteUnit, expected: &str) {
        assert_eq!(
            format_bytes(bytes, unit),
            expected,
            "{bytes} bytes in {unit:?}"
        );
    }

    #[test]
    fn formats_both_units_without_mixing_them() {
        check(0, ByteUnit::Gb, "0.00 GB");
        check(102_096_000_000, ByteUnit::Gb, "102.10 GB");
        check(1 << 30, ByteUnit::Gib, "1.00 GiB");
        check(1 << 30, ByteUnit::Gb, "1.07 GB");
        check(1_000_000_000, ByteUnit::Gib, "0.93 GiB");
        check(4_995_000_000, ByteUnit::Gb, "5.00 GB");
        check(4_994_999_999, ByteUnit::Gb, "4.99 GB");
        check(u64::MAX, ByteUnit::Gb, "18,446,744,073.71 GB");
    }

    #[test]
    fn digits_are_those_of_to_string() {
        for v in [
            0,
            1,
            9,
            10,
            99,
            100,
            12_345,
            u128::from(u64::MAX),
            u128::MAX,
        ] {
            assert_eq!(digits(v).collect::<String>(), v.to_string());
        }
        assert_eq!(
            group_thousands(u128::MAX),
            "340,282,366,920,938,463,463,374,607,431,768,211,455"
        );
        assert_eq!(format_in_unit(1_050_000_000, ByteUnit::Gb), "1.05");
        assert_eq!(format_in_unit(1_005_000_000, ByteUnit::Gb), "1.01");
    }

    #[test]
    fn the_64_bit_paths_equal_the_128_bit_arithmetic() {
        for unit in [ByteUnit::Gb, ByteUnit::Gib] {
            let d = u128::from(unit.bytes_per_unit());
            let edge = (u64::MAX - unit.bytes_per_unit() / 2) / 100;
            for bytes in [
                0,
                1,
                499_999_999,
                500_000_000,
                102_096_000_000,
                edge,
                edge + 1,
                u64::MAX,
            ] {
                let h = (u128::from(bytes) * 100 + d / 2) / d;
                let cents = h % 100 + 100;
                let expected = format!("{}.{}", group_thousands(h / 100), &cents.to_string()[1..]);
                assert_eq!(format_in_unit(bytes, unit), expected, "{bytes} in {unit:?}");
            }
        }
    }

    #[test]
    fn groups_thousands() {
        assert_eq!(group_thousands(0u64), "0");
        assert_eq!(group_thousands(999u64), "999");
        assert_eq!(group_thousands(1000u64), "1,000");
        assert_eq!(group_thousands(102_096_000_000u64), "102,096,000,000");
    }

    #[test]
    fn unit_keys_round_trip() {
        for unit in ByteUnit::ALL {
            assert_eq!(ByteUnit::from_key(unit.key()), Some(unit));
        }
    }
}
