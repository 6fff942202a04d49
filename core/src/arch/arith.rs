//! Byte arithmetic that cannot overflow silently, and the allocator's rounding: below every op
//! kind, so that the op kinds and the adapters' rules share it without importing each other.

use super::error::EstimateError;

/// A byte count beyond 64 bits: the one way the arithmetic below, and the op kinds' tape
/// built on it, fail. A unit, so that each `?` on it writes [`EstimateError::TooLarge`]
/// where a whole [`EstimateError`] would be copied through every caller (hundreds of them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TooLarge;

impl From<TooLarge> for EstimateError {
    fn from(_: TooLarge) -> Self {
        EstimateError::TooLarge
    }
}

/// A figure of the arithmetic or the tape, or [`TooLarge`].
pub(crate) type Res<T> = Result<T, TooLarge>;

/// The CUDA caching allocator's block: every storage is rounded up to it.
pub(crate) const BLOCK: u64 = 512;

// Out of line: inlined, each of the hundreds of calls spells out a 128-bit multiply
// (`__multi3` and its stack slots) to check for overflow.
#[inline(never)]
pub(crate) fn mul(a: u64, b: u64) -> Res<u64> {
    // two factors below 2^32 cannot overflow: a plain multiply (WebAssembly checks a
    // 64-bit product through a 128-bit one, a call of its own)
    if (a | b) >> 32 == 0 {
        return Ok(a * b);
    }
    a.checked_mul(b).ok_or(TooLarge)
}
pub(crate) fn add(a: u64, b: u64) -> Res<u64> {
    a.checked_add(b).ok_or(TooLarge)
}
/// Bytes of one storage of `elems` elements of `bytes` each, rounded to the allocator block.
pub(crate) fn storage(elems: u64, bytes: u64) -> Res<u64> {
    let blocks = mul(elems, bytes)?.div_ceil(BLOCK);
    // (a comparison, not `checked_mul`, which WebAssembly spells as a 128-bit multiply)
    if blocks > u64::MAX / BLOCK {
        return Err(TooLarge);
    }
    Ok(blocks * BLOCK)
}
pub(crate) fn sum_storages(elems: &[u64], bytes: u64) -> Res<u64> {
    elems
        .iter()
        .try_fold(0, |acc, &e| add(acc, storage(e, bytes)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_paths_equal_the_checked_arithmetic() {
        let edges = [
            0,
            1,
            511,
            512,
            513,
            (1 << 32) - 1,
            1 << 32,
            (1 << 32) + 1,
            u64::MAX / BLOCK,
            u64::MAX / BLOCK + 1,
            u64::MAX - 1,
            u64::MAX,
        ];
        for &a in &edges {
            for &b in &edges {
                assert_eq!(mul(a, b).ok(), a.checked_mul(b), "{a} x {b}");
                let checked = a
                    .checked_mul(b)
                    .and_then(|p| p.div_ceil(BLOCK).checked_mul(BLOCK));
                assert_eq!(storage(a, b).ok(), checked, "storage({a}, {b})");
            }
        }
    }
}
