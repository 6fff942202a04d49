//! Byte arithmetic that cannot overflow silently, and the allocator's rounding: below every op
//! kind, so that the op kinds and the adapters' rules share it without importing each other.

use super::error::EstimateError;

pub(crate) type Res<T> = Result<T, EstimateError>;

/// The CUDA caching allocator's block: every storage is rounded up to it.
pub(crate) const BLOCK: u64 = 512;

// Out of line: inlined, each of the hundreds of calls spells out a 128-bit multiply
// (`__multi3` and its stack slots) to check for overflow.
#[inline(never)]
pub(crate) fn mul(a: u64, b: u64) -> Res<u64> {
    a.checked_mul(b).ok_or(EstimateError::TooLarge)
}
pub(crate) fn add(a: u64, b: u64) -> Res<u64> {
    a.checked_add(b).ok_or(EstimateError::TooLarge)
}
/// Bytes of one storage of `elems` elements of `bytes` each, rounded to the allocator block.
pub(crate) fn storage(elems: u64, bytes: u64) -> Res<u64> {
    mul(elems, bytes)?
        .div_ceil(BLOCK)
        .checked_mul(BLOCK)
        .ok_or(EstimateError::TooLarge)
}
pub(crate) fn sum_storages(elems: &[u64], bytes: u64) -> Res<u64> {
    elems
        .iter()
        .try_fold(0, |acc, &e| add(acc, storage(e, bytes)?))
}
