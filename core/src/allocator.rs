//! An emulation of PyTorch's CUDA caching allocator, to turn a sequence of allocations and
//! frees into the peaks `torch.cuda.max_memory_allocated()` and
//! `torch.cuda.max_memory_reserved()` report.
//!
//! Modelled on `c10/cuda/CUDACachingAllocator.cpp` (`DeviceCachingAllocator`), read at
//! pytorch/pytorch commit `001074d25084`; the routines used here (`round_size`, `get_pool`,
//! `get_allocation_size`, `get_free_block`, `should_split`, `alloc_found_block`,
//! `free_block`, `try_merge_blocks`, `find_expandable_block`, `map_block`,
//! `try_allocate_expandable_block`) and the page sizes of expandable segments read the same
//! in the other stored copies of that file. Each rule below cites the function it follows.
//!
//! What is modelled, at the allocator's default settings (`PYTORCH_CUDA_ALLOC_CONF` unset,
//! or `expandable_segments:True` alone):
//!
//! * One device, its streams kept apart: a block is cached for the stream that allocated it
//!   (blocks compare by stream first in `BlockComparatorSize`; see [`malloc_on`]), which is
//!   what keeps the buffers of FSDP's all-gather and reduce-scatter streams from being
//!   reused by the default stream's tensors. No private pool of a CUDA graph.
//! * An infinite device by default: `cudaMalloc` and `cuMemCreate` never fail (short of
//!   exhausting the emulated 2^64 bytes of address space, 16 EiB), nothing is ever handed
//!   back to the driver, and reserved bytes only grow, as `max_memory_reserved()` reports on
//!   a device large enough for the workload. With a [capacity](CachingAllocator::set_capacity)
//!   (what `cudaMalloc` can hand out), the default mode runs the OOM path of `malloc`:
//!   `release_available_cached_blocks` does nothing at the default `max_split_size`, then
//!   `release_cached_blocks` hands every cached block that is a whole segment back
//!   (`release_blocks`: `!block->prev && !block->next`) and `alloc_block` is retried; a
//!   request that still does not fit is an out-of-memory error. With expandable segments a
//!   mapping past the capacity fails the same way, and `release_cached_blocks` unmaps the
//!   whole pages of every free block (`release_blocks` -> `unmap_block`) before the retry.
//!   `empty_cache` never runs.
//! * Cross-stream uses (`record_stream`) as their caller orders them: [`free`] caches a block
//!   at once (`free_block` when `stream_uses` is empty: FSDP2 synchronises with events);
//!   [`free_in_use`] drops `memory_allocated` but keeps the block out of its pool until
//!   [`release`], when its events would complete (`insert_events`, `process_events`: FSDP1's
//!   hand-offs). Before the OOM path releases the cached segments it completes every
//!   pending event (`release_cached_blocks` -> `synchronize_and_free_events`): those blocks
//!   are cached first, and a later [`release`] of one is a no-op.
//!
//! [`malloc_on`]: CachingAllocator::malloc_on
//! [`free`]: CachingAllocator::free
//! [`free_in_use`]: CachingAllocator::free_in_use
//! [`release`]: CachingAllocator::release
//!
//! What cannot be pinned down from the source: the addresses `cudaMalloc` returns. They only
//! break ties between free blocks of equal size (`BlockComparatorSize` orders by size, then
//! pointer); here segments get increasing addresses in the order they are created.
#![allow(clippy::module_name_repetitions)]

/// `kMinBlockSize`: "all sizes are rounded to at least 512 bytes" (`round_size`), and the
/// smallest remainder the small pool splits off (`should_split`).
const MIN_BLOCK_SIZE: u64 = 512;
/// `kSmallSize`: "largest 'small' allocation is 1 MiB" (`get_pool`), and the remainder a
/// large-pool block must exceed to be split (`should_split`).
const SMALL_SIZE: u64 = 1_048_576;
/// `kSmallBuffer`: "'small' allocations are packed in 2 MiB blocks" (`get_allocation_size`),
/// and the page size of the small pool's expandable segment (`find_expandable_block`).
const SMALL_BUFFER: u64 = 2_097_152;
/// `kLargeBuffer`: "'large' allocations may be packed in 20 MiB blocks"
/// (`get_allocation_size`), and the page size of the large pool's expandable segment
/// (`find_expandable_block`).
const LARGE_BUFFER: u64 = 20_971_520;
/// `kMinLargeAlloc`: "allocations between 1 and 10 MiB may use kLargeBuffer".
const MIN_LARGE_ALLOC: u64 = 10_485_760;
/// `kRoundLarge`: "round up large allocations to 2 MiB" (`get_allocation_size`).
const ROUND_LARGE: u64 = 2_097_152;
/// `CUDAAllocatorConfig::max_split_size()` by default: `std::numeric_limits<size_t>::max()`
/// (`m_max_split_size` in the `CUDAAllocatorConfig` constructor), so no block is "oversize".
const MAX_SPLIT_SIZE: u64 = u64::MAX;
/// `NativeCachingAllocator::allocate` refuses a request of `one_exa_bytes` (2^60) or more
/// with "Tried to allocate more than 1EB memory". Refusing them here too keeps every block
/// size far from `u64::MAX`.
const ONE_EXA_BYTES: u64 = 1 << 60;
/// Virtual address space of one expandable segment. The source reserves 1 1/8 of the GPU's
/// memory (`ExpandableSegment`'s constructor: `totalGlobalMem + totalGlobalMem / 8`); on an
/// infinite device that is unbounded, so 2 EiB stands in for it: more than any request
/// (< 1 EiB), and a segment that fills up is followed by a new one, as
/// `find_expandable_block` does.
const EXPANDABLE_ADDRESS_SPACE: u64 = 1 << 61;

/// No block: the end of a `prev`/`next` chain, or no expandable segment.
const NIL: usize = usize::MAX;

/// Which caching-allocator configuration to emulate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum AllocatorMode {
    /// The default: one `cudaMalloc` segment per cache miss (`expandable_segments:False`).
    #[default]
    Default,
    /// `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`: one segment per pool that grows
    /// by mapping pages (2 MiB in the small pool, 20 MiB in the large pool).
    Expandable,
}

impl AllocatorMode {
    /// Both modes, default first.
    pub const ALL: [AllocatorMode; 2] = [AllocatorMode::Default, AllocatorMode::Expandable];

    /// Short stable key used in URLs.
    #[must_use]
    pub const fn key(self) -> &'static str {
        match self {
            AllocatorMode::Default => "default",
            AllocatorMode::Expandable => "expandable",
        }
    }

    /// Name shown to a person: the setting as `PYTORCH_CUDA_ALLOC_CONF` spells it.
    #[must_use]
    pub const fn label(self) -> &'static str {
        match self {
            AllocatorMode::Default => "Default (one segment per cudaMalloc)",
            AllocatorMode::Expandable => "Expandable segments (expandable_segments:True)",
        }
    }

    /// The mode whose [`key`](Self::key) is `key`.
    #[must_use]
    pub fn from_key(key: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.key() == key)
    }
}

/// A live allocation, as [`CachingAllocator::malloc`] hands it out; pass it to
/// [`CachingAllocator::free`] of the same allocator. A stale id frees nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BlockId {
    slot: usize,
    generation: u32,
}

impl BlockId {
    /// What a request of 0 bytes gets: `allocate` hands out a null pointer without calling
    /// `malloc`, and freeing it does nothing.
    const NULL: BlockId = BlockId {
        slot: NIL,
        generation: 0,
    };
}

/// The two pools of `DeviceCachingAllocator`: `small_blocks` and `large_blocks`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PoolKind {
    Small,
    Large,
}

/// Streams the emulation keeps apart: the default stream and the streams a data-parallel
/// engine runs its collectives on (FSDP's all-gather and reduce-scatter streams).
pub const STREAMS: usize = 4;

/// One stream's share of a pool. The source keeps each stream's blocks in the same
/// `small_blocks` / `large_blocks` sets but orders them by stream first
/// (`BlockComparatorSize`) and searches from the requesting stream's key (`get_free_block`),
/// so a stream never takes another's cached block; a segment and its blocks belong to the
/// stream that allocated it (`alloc_block`, and with expandable segments one segment per
/// stream: `find_expandable_block` skips the others' `expandable_segments_`). Here each
/// stream has its own pair of pools: `2 * stream + kind`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Pool(u8);

impl Pool {
    /// The pool of `kind` of `stream` (streams past the last share it).
    const fn of(stream: u8, kind: PoolKind) -> Pool {
        let stream = if (stream as usize) < STREAMS {
            stream
        } else {
            STREAMS as u8 - 1
        };
        Pool(stream * 2 + kind as u8)
    }

    const fn kind(self) -> PoolKind {
        if self.0.is_multiple_of(2) {
            PoolKind::Small
        } else {
            PoolKind::Large
        }
    }
}

/// A `Block` of the source: a run of bytes of one segment, free, allocated or (in an
/// expandable segment) not backed by pages.
#[derive(Clone, Copy, Debug)]
struct Block {
    /// `ptr`: emulated device addresses, segments laid end to end from 0.
    addr: u64,
    size: u64,
    prev: usize,
    next: usize,
    /// Index into `CachingAllocator::segments` (`expandable_segment_`), or `NIL`.
    segment: usize,
    pool: Pool,
    allocated: bool,
    /// `mapped`: always true outside expandable segments.
    mapped: bool,
    /// Bumped each time the block is handed out, so a stale [`BlockId`] never matches.
    generation: u32,
    /// The slot holds a block (slots of merged blocks are recycled).
    live: bool,
}

/// A `BlockPool`: the free, mapped blocks ordered as `BlockComparatorSize` orders them
/// (size, then address: see [`size_key`]), and the unmapped ones ordered by address
/// (`BlockComparatorAddress`).
#[derive(Clone, Debug, Default)]
struct BlockPool {
    blocks: SortedMap,
    unmapped: SortedMap,
}

/// A map ordered by key, kept as sorted vectors, one per power of two of the key's size:
/// a pool holds hundreds of free blocks, where a binary search and a short move within one
/// size class beat a B-tree in time and weigh far less in the WebAssembly bundle (one
/// vector for all moved 40% more instructions; finer classes gained nothing, blocks of one
/// size being what crowds a class). Classes in order and keys in order within each is the
/// keys' order.
///
/// Each class is sorted in descending order: a step frees its saved tensors from the last
/// layer to the first (each at a lower address than the one before) and the next step takes
/// them back lowest address first, so both land at the end of the vector, where nothing
/// moves (in ascending order every one moved the whole class).
///
/// All 65 classes exist from the start, so finding one is an index, never a growth check.
#[derive(Clone, Debug)]
struct SortedMap {
    classes: [Vec<(Key, usize)>; 65],
    /// Bit `c` set for every class `c` < 64 that holds an entry (and maybe for some emptied
    /// since, which are skipped): a search that misses its own class finds the next one
    /// with an entry from this word, instead of walking the empty classes in between one
    /// by one (0.6% of the advisor's instructions).
    occupied: u64,
}

impl Default for SortedMap {
    fn default() -> Self {
        SortedMap {
            classes: std::array::from_fn(|_| Vec::new()),
            occupied: 0,
        }
    }
}

/// The `BlockComparatorSize` order: size, then address (two integers rather than one
/// 128-bit one, which WebAssembly has no instructions for).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Key {
    size: u64,
    addr: u64,
}

/// Where an entry of a [`SortedMap`] is: its class and its index in the class.
type Position = (usize, usize);

impl SortedMap {
    /// The size class of `key`: 0 for no size, else the bit length of the size.
    fn class(key: Key) -> usize {
        64 - key.size.leading_zeros() as usize
    }
    /// `1 << class`, or 0 for class 64 (which no bit stands for).
    fn bit(class: usize) -> u64 {
        1u64.checked_shl(class as u32).unwrap_or(0)
    }
    fn bucket(&mut self, key: Key) -> &mut Vec<(Key, usize)> {
        &mut self.classes[Self::class(key)]
    }
    /// Clears the bit of `class` if its last entry is gone.
    #[inline(always)]
    fn note_removal(&mut self, class: usize) {
        if self.classes[class].is_empty() {
            self.occupied &= !Self::bit(class);
        }
    }
    fn insert(&mut self, key: Key, value: usize) {
        self.occupied |= Self::bit(Self::class(key));
        let bucket = self.bucket(key);
        // Below the class's smallest key is the usual place (see the type's documentation):
        // a push, with no search.
        if bucket.last().is_none_or(|&(last, _)| key < last) {
            bucket.push((key, value));
            return;
        }
        match bucket.binary_search_by(|&(k, _)| key.cmp(&k)) {
            Ok(i) => bucket[i].1 = value,
            Err(i) => bucket.insert(i, (key, value)),
        }
    }
    fn remove(&mut self, key: Key) -> Option<usize> {
        let bucket = self.bucket(key);
        let value = match bucket.last() {
            Some(&(last, value)) if last == key => {
                bucket.pop();
                value
            }
            _ => {
                let i = bucket.binary_search_by(|&(k, _)| key.cmp(&k)).ok()?;
                bucket.remove(i).1
            }
        };
        self.note_removal(Self::class(key));
        Some(value)
    }
    /// Removes the entry at `at` (from [`Self::first_from`]), without searching again.
    fn remove_at(&mut self, (class, i): Position) {
        if let Some(bucket) = self.classes.get_mut(class) {
            // the smallest key of its class, often: then nothing moves
            if i + 1 == bucket.len() {
                bucket.pop();
            } else if i < bucket.len() {
                bucket.remove(i);
            }
            self.note_removal(class);
        }
    }
    /// Empties the map, keeping its vectors for the next replay.
    fn clear(&mut self) {
        for bucket in &mut self.classes {
            bucket.clear();
        }
        self.occupied = 0;
    }
    /// The entries from `from` on, in key order.
    fn range(&self, from: Key) -> impl Iterator<Item = (Key, usize)> + '_ {
        let class = Self::class(from);
        let first = self
            .classes
            .get(class)
            .map_or(&[][..], |b| &b[..b.partition_point(|&(k, _)| k >= from)]);
        first
            .iter()
            .rev()
            .chain(
                self.classes
                    .iter()
                    .skip(class + 1)
                    .flat_map(|b| b.iter().rev()),
            )
            .copied()
    }
    /// The first entry from `from` on ([`Self::range`]'s first, without its iterator) and
    /// where it is.
    fn first_from(&self, from: Key) -> Option<((Key, usize), Position)> {
        let class = Self::class(from);
        if let Some(b) = self.classes.get(class) {
            let i = b.partition_point(|&(k, _)| k >= from);
            if let Some(found) = i.checked_sub(1).and_then(|j| b.get(j)) {
                return Some((*found, (class, i - 1)));
            }
        }
        // the classes above, lowest first: those whose bit is set, then class 64
        // (from class 63 on no bit is above: `bit(64)` is 0, and so is the mask)
        let mut above = self.occupied & !(Self::bit(class + 1).wrapping_sub(1));
        while above != 0 {
            let c = above.trailing_zeros() as usize;
            if let Some(&found) = self.classes[c].last() {
                return Some((found, (c, self.classes[c].len() - 1)));
            }
            above &= above - 1;
        }
        let last = self.classes.len() - 1;
        if class < last {
            if let Some(&found) = self.classes[last].last() {
                return Some((found, (last, self.classes[last].len() - 1)));
            }
        }
        None
    }
    /// The values in key order.
    fn values(&self) -> impl Iterator<Item = &usize> {
        self.classes
            .iter()
            .flat_map(|b| b.iter().rev())
            .map(|(_, v)| v)
    }
}

/// The key of a free block of the pools.
const fn size_key(size: u64, addr: u64) -> Key {
    Key { size, addr }
}

/// The key of an unmapped block: its address alone.
const fn addr_key(addr: u64) -> Key {
    Key { size: 0, addr }
}

/// An `ExpandableSegment`: its base address and page size (`segment_size_`).
#[derive(Clone, Copy, Debug)]
struct ExpandableSegment {
    base: u64,
    page: u64,
}

/// Replays allocations and frees through an emulation of PyTorch's CUDA caching allocator
/// (see the module documentation for what is modelled) and tracks allocated and reserved
/// bytes and their peaks.
///
/// ```
/// use estimator_core::{AllocatorMode, CachingAllocator};
/// let mut a = CachingAllocator::new(AllocatorMode::Default);
/// let x = a.malloc(5 << 20); // a 5 MiB request is carved from a fresh 20 MiB segment
/// let _y = a.malloc(5 << 20); // and the next one reuses its remainder
/// a.free(x);
/// assert_eq!((a.allocated(), a.reserved()), (5 << 20, 20 << 20));
/// assert_eq!(a.peak_allocated(), 10 << 20);
/// ```
#[derive(Clone, Debug)]
pub struct CachingAllocator {
    mode: AllocatorMode,
    /// The hot paths index it as a slice (`as_slice`, `as_mut_slice`): that is a bounds
    /// check in place, where `Vec`'s `Index` stays a call at the page's opt-level "z".
    blocks: Vec<Block>,
    /// The last slot a merge emptied, or `NIL`; each empty slot's `next` is the one emptied
    /// before it (a list threaded through the slots, where a vector of them took a push and
    /// its growth check per merge).
    free_slot: usize,
    /// `small_blocks` and `large_blocks` of each stream, indexed by [`Pool`].
    pools: [BlockPool; 2 * STREAMS],
    /// Streams used since the allocator was made or [reset](Self::reset): only their pools
    /// are searched on release and cleared on reset (a replay of one stream, the page's
    /// thousands of them, pays for no other).
    streams_used: u8,
    segments: Vec<ExpandableSegment>,
    /// Where the next segment starts: fresh address space, since nothing is ever freed.
    next_addr: u64,
    allocated: u64,
    reserved: u64,
    peak_allocated: u64,
    peak_reserved: u64,
    /// What `cudaMalloc` can hand out (`u64::MAX`: an infinite device).
    capacity: u64,
    /// A request failed after the cached segments were released (the step runs out of
    /// memory); the allocator goes on as if the device were larger (a step's replay stops
    /// there: see `AllocatorPeaks::out_of_memory`).
    out_of_memory: bool,
    /// Blocks [freed in use](Self::free_in_use) whose events have not completed.
    pending: Vec<BlockId>,
}

impl CachingAllocator {
    /// An empty allocator: nothing allocated, nothing reserved.
    #[must_use]
    pub fn new(mode: AllocatorMode) -> Self {
        CachingAllocator {
            mode,
            blocks: Vec::new(),
            free_slot: NIL,
            pools: std::array::from_fn(|_| BlockPool::default()),
            streams_used: 1,
            segments: Vec::new(),
            next_addr: 0,
            allocated: 0,
            reserved: 0,
            peak_allocated: 0,
            peak_reserved: 0,
            capacity: u64::MAX,
            out_of_memory: false,
            pending: Vec::new(),
        }
    }

    /// Lets `cudaMalloc` hand out at most `bytes` in all (the device less the CUDA context
    /// and whatever lives outside the allocator), so that a cache miss that would pass it
    /// first releases the cached segments, as a real device does before it raises an
    /// out-of-memory error (see the module documentation).
    pub fn set_capacity(&mut self, bytes: u64) {
        self.capacity = bytes;
    }

    /// Whether a request could not be met within the [capacity](Self::set_capacity) even
    /// after the cached segments were released.
    #[must_use]
    pub const fn out_of_memory(&self) -> bool {
        self.out_of_memory
    }

    /// Makes this allocator as [`new`](Self::new) would, keeping the memory of its
    /// vectors: a replay after another one then grows none of them again.
    pub(crate) fn reset(&mut self, mode: AllocatorMode) {
        self.mode = mode;
        self.blocks.clear();
        self.free_slot = NIL;
        for pool in self
            .pools
            .iter_mut()
            .take(2 * usize::from(self.streams_used))
        {
            pool.blocks.clear();
            pool.unmapped.clear();
        }
        self.streams_used = 1;
        self.segments.clear();
        self.next_addr = 0;
        self.allocated = 0;
        self.reserved = 0;
        self.peak_allocated = 0;
        self.peak_reserved = 0;
        self.capacity = u64::MAX;
        self.out_of_memory = false;
        self.pending.clear();
    }

    /// The mode this allocator emulates.
    #[must_use]
    pub const fn mode(&self) -> AllocatorMode {
        self.mode
    }

    /// Allocates `bytes`, as `torch.empty(bytes, dtype=torch.uint8, device="cuda")` would.
    ///
    /// A request of 0 bytes allocates nothing (`allocate` skips `malloc`), and so does one of
    /// 1 EiB or more (`allocate` raises an out-of-memory error) or one that would take the
    /// emulated address space past 2^64 bytes; all return an id that frees nothing.
    pub fn malloc(&mut self, bytes: u64) -> BlockId {
        self.malloc_on(bytes, 0)
    }

    /// [`malloc`](Self::malloc) on `stream` (0 is the default stream; streams from
    /// [`STREAMS`] on share the last one's pools): the block comes from that stream's cached
    /// blocks or a new segment of its own, and goes back to them when freed, whichever
    /// stream frees it (what the source does for a block no other stream uses:
    /// `record_stream` is not emulated).
    pub fn malloc_on(&mut self, bytes: u64, stream: u8) -> BlockId {
        if bytes == 0 || bytes >= ONE_EXA_BYTES {
            return BlockId::NULL;
        }
        // `malloc`: round, pick the pool, search it, and only on a miss grow the cache.
        let size = round_size(bytes);
        let pool = Pool::of(stream, get_pool(size));
        self.streams_used = self.streams_used.max(pool.0 / 2 + 1);
        let found = match self.get_free_block(pool, size) {
            Some(block) => Some(block),
            None => self.alloc_block(pool, size),
        };
        let Some(block) = found else {
            // Unreachable on an infinite device; kept so no input can panic.
            return BlockId::NULL;
        };
        self.alloc_found_block(block, size)
    }

    /// Frees a block [`malloc`](Self::malloc) handed out. Freeing it again, or an id this
    /// allocator never handed out, does nothing. (An id means something only to the
    /// allocator that handed it out.)
    pub fn free(&mut self, id: BlockId) {
        let Some(block) = self.blocks.get_mut(id.slot) else {
            return;
        };
        if !block.live || !block.allocated || block.generation != id.generation {
            return;
        }
        // `free`: the stats drop by the block's size, then `free_block` caches it.
        block.allocated = false;
        let (size, prev, next) = (block.size, block.prev, block.next);
        self.allocated = self.allocated.saturating_sub(size);
        self.free_block(id.slot, prev, next);
    }

    /// `free` of a block another stream still uses (`record_stream`): `free` drops the stats
    /// at once but, the block's `stream_uses` not empty, only inserts events; the block
    /// returns to its pool when `process_events` finds them complete, here at
    /// [`release`](Self::release). Until then it is neither reused nor merged.
    pub fn free_in_use(&mut self, id: BlockId) {
        if let Some(b) = self.blocks.get(id.slot) {
            if b.live && b.allocated && b.generation == id.generation {
                self.allocated = self.allocated.saturating_sub(b.size);
                self.pending.push(id);
            }
        }
    }

    /// The events of a block given to [`free_in_use`](Self::free_in_use) complete: it is
    /// cached for its stream (call it once per such block).
    pub fn release(&mut self, id: BlockId) {
        let Some(at) = self.pending.iter().position(|&p| p == id) else {
            return;
        };
        self.pending.swap_remove(at);
        if let Some(b) = self.blocks.get(id.slot) {
            if b.live && b.allocated && b.generation == id.generation {
                self.allocated = self.allocated.saturating_add(b.size);
                self.free(id);
            }
        }
    }

    /// `synchronize_and_free_events`: every pending event completes, each block freed in
    /// use cached for its stream.
    fn synchronize_and_free_events(&mut self) {
        while let Some(&id) = self.pending.last() {
            self.release(id);
        }
    }

    /// Bytes in live blocks: `memory_allocated()`. Each block counts its rounded size, or in
    /// the default mode a little more when a large-pool block was handed out whole because
    /// the rest (1 MiB or less) was too small to split off (`should_split`).
    #[must_use]
    pub const fn allocated(&self) -> u64 {
        self.allocated
    }

    /// Bytes held from the device: `cudaMalloc` segments, or mapped pages of expandable
    /// segments (`memory_reserved()`).
    #[must_use]
    pub const fn reserved(&self) -> u64 {
        self.reserved
    }

    /// The most [`allocated`](Self::allocated) has been: `max_memory_allocated()`.
    #[must_use]
    pub const fn peak_allocated(&self) -> u64 {
        self.peak_allocated
    }

    /// The most [`reserved`](Self::reserved) has been: `max_memory_reserved()`. With no
    /// `empty_cache` and no OOM retry this equals `reserved()`.
    #[must_use]
    pub const fn peak_reserved(&self) -> u64 {
        self.peak_reserved
    }

    fn pool(&self, pool: Pool) -> &BlockPool {
        &self.pools[pool.0 as usize]
    }

    fn pool_mut(&mut self, pool: Pool) -> &mut BlockPool {
        &mut self.pools[pool.0 as usize]
    }

    fn expandable(&self) -> bool {
        self.mode == AllocatorMode::Expandable
    }

    /// A slot for a new block, reusing one a merge emptied. The slot's generation carries
    /// over so ids of its earlier blocks stay stale.
    ///
    /// The block is taken apart and written field by field: copied whole, it was a
    /// `memory.copy` in WebAssembly, a call out of the module, on most `malloc`s.
    fn new_block(&mut self, block: Block) -> usize {
        let Block {
            addr,
            size,
            prev,
            next,
            segment,
            pool,
            allocated,
            mapped,
            // (a reused slot keeps its own generation)
            generation: _,
            live,
        } = block;
        if let Some(b) = self.blocks.get_mut(self.free_slot) {
            let slot = self.free_slot;
            self.free_slot = b.next;
            b.addr = addr;
            b.size = size;
            b.prev = prev;
            b.next = next;
            b.segment = segment;
            b.pool = pool;
            b.allocated = allocated;
            b.mapped = mapped;
            b.live = live;
            slot
        } else {
            // (a new slot: rare, the block as it is)
            self.blocks.push(block);
            self.blocks.len() - 1
        }
    }

    fn delete_block(&mut self, slot: usize) {
        let b = &mut self.blocks.as_mut_slice()[slot];
        b.live = false;
        b.next = self.free_slot;
        self.free_slot = slot;
    }

    fn grow_reserved(&mut self, bytes: u64) {
        self.reserved = self.reserved.saturating_add(bytes);
        self.peak_reserved = self.peak_reserved.max(self.reserved);
    }

    /// `get_free_block`: the smallest cached block of at least `size` bytes (ties to the
    /// lower address), removed from the pool.
    // The source's two oversize rules are kept as it writes them, though at the default
    // max_split_size (the constant SIZE_MAX) the compiler folds them.
    #[allow(clippy::absurd_extreme_comparisons)]
    fn get_free_block(&mut self, pool: Pool, size: u64) -> Option<usize> {
        let blocks = self.blocks.as_slice();
        let ((mut key, mut slot), at) = self.pools[pool.0 as usize]
            .blocks
            .first_from(size_key(size, 0))?;
        let mut moved = false;
        // (the mode first: in the default mode the block is not looked up for it)
        if self.mode == AllocatorMode::Expandable && blocks[slot].segment != NIL {
            let mut candidates = self.pools[pool.0 as usize].blocks.range(key);
            candidates.next();
            // "for the purposes of 'best fit' we consider its size to be the size it can
            // expand to": a free block followed by unmapped address space counts as that
            // much bigger, and the search walks on while the next block is smaller so.
            let expandable_size = |s: usize| {
                let b = &blocks[s];
                let tail = match blocks.get(b.next) {
                    Some(n) if !n.mapped => n.size,
                    _ => 0,
                };
                b.size.saturating_add(tail)
            };
            for (k, s) in candidates.by_ref() {
                if blocks[slot].segment == NIL || expandable_size(s) >= expandable_size(slot) {
                    break;
                }
                key = k;
                slot = s;
                moved = true;
            }
        }
        let found = blocks[slot].size;
        // "Do not return an oversized block for a large request": no block reaches the
        // default max_split_size (SIZE_MAX), so neither rule ever refuses one here.
        if size < MAX_SPLIT_SIZE && found >= MAX_SPLIT_SIZE {
            return None;
        }
        // "Allow oversized block size to be rounded up but within a limit".
        if size >= MAX_SPLIT_SIZE && found >= size.saturating_add(LARGE_BUFFER) {
            return None;
        }
        let blocks = &mut self.pool_mut(pool).blocks;
        if moved {
            blocks.remove(key);
        } else {
            // where the search found it: no second search
            blocks.remove_at(at);
        }
        Some(slot)
    }

    /// `alloc_block`: a new segment from `cudaMalloc` of `get_allocation_size(size)` bytes,
    /// or, with expandable segments, `try_allocate_expandable_block`.
    fn alloc_block(&mut self, pool: Pool, size: u64) -> Option<usize> {
        if self.expandable() {
            if let Some(block) = self.try_allocate_expandable_block(pool, size) {
                return Some(block);
            }
            if self.capacity == u64::MAX {
                return None;
            }
            // `malloc`'s retry: `release_cached_blocks` completes the pending events, then
            // unmaps the free pages of the expandable segments (`release_blocks` ->
            // `unmap_block`), so a hole a freed tensor left in the middle of a segment can be
            // mapped again where it is needed
            self.synchronize_and_free_events();
            self.unmap_free_blocks();
            if let Some(block) = self.try_allocate_expandable_block(pool, size) {
                return Some(block);
            }
            // out of memory: mapped anyway, for how much the step misses
            self.out_of_memory = true;
            let capacity = std::mem::replace(&mut self.capacity, u64::MAX);
            let block = self.try_allocate_expandable_block(pool, size);
            self.capacity = capacity;
            return block;
        }
        let alloc_size = get_allocation_size(size);
        // `malloc`'s retry: complete the pending events, release the whole cached
        // segments, then try again
        if self.reserved.saturating_add(alloc_size) > self.capacity {
            self.synchronize_and_free_events();
            self.release_cached_blocks();
            if self.reserved.saturating_add(alloc_size) > self.capacity {
                self.out_of_memory = true;
            }
        }
        let addr = self.next_addr;
        // The emulated device has 2^64 bytes of address space; past it `cudaMalloc` fails.
        self.next_addr = addr.checked_add(alloc_size)?;
        let slot = self.new_block(Block {
            addr,
            size: alloc_size,
            prev: NIL,
            next: NIL,
            segment: NIL,
            pool,
            allocated: false,
            mapped: true,
            generation: 0,
            live: true,
        });
        self.grow_reserved(alloc_size);
        Some(slot)
    }

    /// `release_cached_blocks` in the default mode: every cached block that is a whole
    /// segment (`release_blocks`: no `prev`, no `next`) goes back to the driver.
    fn release_cached_blocks(&mut self) {
        for kind in every_pool(self.streams_used) {
            let whole: Vec<(Key, usize)> = self
                .pool(kind)
                .blocks
                .values()
                .filter_map(|&slot| {
                    let b = &self.blocks.as_slice()[slot];
                    (b.prev == NIL && b.next == NIL).then_some((size_key(b.size, b.addr), slot))
                })
                .collect();
            for (key, slot) in whole {
                self.pool_mut(kind).blocks.remove(key);
                self.reserved = self.reserved.saturating_sub(key.size);
                self.delete_block(slot);
            }
        }
    }

    /// `release_blocks` with expandable segments: every free block's whole pages are
    /// unmapped (`unmap_block`).
    fn unmap_free_blocks(&mut self) {
        for kind in every_pool(self.streams_used) {
            let free: Vec<usize> = self
                .pool(kind)
                .blocks
                .values()
                .copied()
                .filter(|&slot| self.blocks[slot].segment != NIL)
                .collect();
            for slot in free {
                self.unmap_block(slot);
            }
        }
    }

    /// `unmap_block`: unmaps the pages wholly inside the free block `slot` (`unmap` rounds
    /// its range inward), leaving the partial pages at either end as free mapped blocks, and
    /// merges the unmapped part with unmapped neighbours.
    fn unmap_block(&mut self, slot: usize) {
        let b = self.blocks[slot];
        let Some(&ExpandableSegment { base, page }) = self.segments.get(b.segment) else {
            return;
        };
        let offset = b.addr.saturating_sub(base);
        let begin = base.saturating_add(times(offset.div_ceil(page), page));
        let end = base.saturating_add(times(offset.saturating_add(b.size) / page, page));
        if end <= begin {
            return;
        }
        self.pool_mut(b.pool)
            .blocks
            .remove(size_key(b.size, b.addr));
        let mapped_rest = |addr, size, prev, next| Block {
            addr,
            size,
            prev,
            next,
            segment: b.segment,
            pool: b.pool,
            allocated: false,
            mapped: true,
            generation: 0,
            live: true,
        };
        if begin > b.addr {
            // prev -> before -> slot
            let before = self.new_block(mapped_rest(b.addr, begin - b.addr, b.prev, slot));
            if let Some(p) = self.blocks.get_mut(b.prev) {
                p.next = before;
            }
            self.blocks[slot].prev = before;
            self.pool_mut(b.pool)
                .blocks
                .insert(size_key(begin - b.addr, b.addr), before);
        }
        let block_end = b.addr.saturating_add(b.size);
        if end < block_end {
            // slot -> after -> next
            let after = self.new_block(mapped_rest(end, block_end - end, slot, b.next));
            if let Some(n) = self.blocks.get_mut(b.next) {
                n.prev = after;
            }
            self.blocks[slot].next = after;
            self.pool_mut(b.pool)
                .blocks
                .insert(size_key(block_end - end, end), after);
        }
        let u = &mut self.blocks[slot];
        u.addr = begin;
        u.size = end - begin;
        u.mapped = false;
        self.reserved = self.reserved.saturating_sub(end - begin);
        let (prev, next) = (self.blocks[slot].prev, self.blocks[slot].next);
        self.try_merge_blocks(slot, prev);
        self.try_merge_blocks(slot, next);
        let addr = self.blocks[slot].addr;
        self.pool_mut(b.pool).unmapped.insert(addr_key(addr), slot);
    }

    /// `should_split`: whether the rest of `block` after `size` bytes goes back to the pool.
    fn should_split(&self, b: &Block, size: u64) -> bool {
        let remaining = b.size.saturating_sub(size);
        if b.pool.kind() == PoolKind::Small || self.expandable() {
            remaining >= MIN_BLOCK_SIZE
        } else {
            size < MAX_SPLIT_SIZE && remaining > SMALL_SIZE
        }
    }

    /// `alloc_found_block`: splits the first `size` bytes off `block` when it
    /// [should](Self::should_split), the rest going back to the pool, and hands the block out.
    fn alloc_found_block(&mut self, block: usize, size: u64) -> BlockId {
        let mut handed = block;
        let rest = &self.blocks.as_slice()[block];
        if self.should_split(rest, size) {
            let (addr, prev, pool) = (rest.addr, rest.prev, rest.pool);
            let front = self.new_block(Block {
                addr,
                size,
                prev,
                next: block,
                segment: rest.segment,
                pool,
                allocated: false,
                mapped: true,
                generation: 0,
                live: true,
            });
            if let Some(prev) = self.blocks.get_mut(prev) {
                prev.next = front;
            }
            let remaining = &mut self.blocks.as_mut_slice()[block];
            remaining.prev = front;
            remaining.addr = addr.saturating_add(size);
            remaining.size = remaining.size.saturating_sub(size);
            let key = size_key(remaining.size, remaining.addr);
            self.pool_mut(pool).blocks.insert(key, block);
            handed = front;
        }
        let b = &mut self.blocks.as_mut_slice()[handed];
        b.allocated = true;
        b.generation = b.generation.wrapping_add(1);
        let id = BlockId {
            slot: handed,
            generation: b.generation,
        };
        self.allocated = self.allocated.saturating_add(b.size);
        self.peak_allocated = self.peak_allocated.max(self.allocated);
        id
    }

    /// `free_block`: merges the freed block with free neighbours and caches it. (`free`
    /// passes the neighbours it has read already: each look-up of a block is a call at this
    /// optimisation level.)
    fn free_block(&mut self, block: usize, prev: usize, next: usize) {
        self.try_merge_blocks(block, prev);
        self.try_merge_blocks(block, next);
        let b = &self.blocks.as_slice()[block];
        let (key, pool) = (size_key(b.size, b.addr), b.pool);
        self.pool_mut(pool).blocks.insert(key, block);
    }

    /// `try_merge_blocks`: absorbs `src` into its neighbour `dst` when `src` is free and
    /// equally mapped; returns the bytes absorbed (0 when it does not merge).
    ///
    /// Most neighbours are allocated or absent: that is read here, where the call is
    /// inlined, and only a free neighbour goes on to [`Self::merge_blocks`].
    #[inline(always)]
    fn try_merge_blocks(&mut self, dst: usize, src: usize) -> u64 {
        match self.blocks.get(src) {
            Some(s) if s.live && !s.allocated => self.merge_blocks(dst, src),
            _ => 0,
        }
    }

    /// [`Self::try_merge_blocks`] of a free `src`.
    fn merge_blocks(&mut self, dst: usize, src: usize) -> u64 {
        let s = &self.blocks.as_slice()[src];
        // the fields read one by one: a copy of the whole block per neighbour was a memcpy
        let (addr, size, prev, next, pool, mapped) =
            (s.addr, s.size, s.prev, s.next, s.pool, s.mapped);
        let d = &mut self.blocks.as_mut_slice()[dst];
        if d.mapped != mapped {
            return 0;
        }
        d.size = d.size.saturating_add(size);
        if d.prev == src {
            // [src dst]
            d.addr = addr;
            d.prev = prev;
            if let Some(p) = self.blocks.get_mut(prev) {
                p.next = dst;
            }
        } else {
            // [dst src]
            d.next = next;
            if let Some(n) = self.blocks.get_mut(next) {
                n.prev = dst;
            }
        }
        let pool = self.pool_mut(pool);
        if mapped {
            pool.blocks.remove(size_key(size, addr));
        } else {
            pool.unmapped.remove(addr_key(addr));
        }
        self.delete_block(src);
        size
    }

    /// `find_expandable_block`: the lowest-addressed run of free and unmapped blocks that
    /// holds `size` bytes, or the unmapped whole of a new segment.
    fn find_expandable_block(&mut self, pool: Pool, size: u64) -> Option<usize> {
        let blocks = &self.blocks;
        let allocatable = |s: usize| blocks.get(s).is_some_and(|b| b.live && !b.allocated);
        let has_available_address_space = |mut s: usize| {
            let mut bytes: u64 = 0;
            while bytes < size && allocatable(s) {
                bytes = bytes.saturating_add(blocks[s].size);
                s = blocks[s].next;
            }
            bytes >= size
        };
        for &unmapped in self.pool(pool).unmapped.values() {
            // "there might be a free segment we can also use right before it"
            let mut c = unmapped;
            if allocatable(blocks[c].prev) {
                c = blocks[c].prev;
            }
            if has_available_address_space(c) {
                return Some(c);
            }
        }
        // "2MB for small pool, 20MB for large pool"
        let page = match pool.kind() {
            PoolKind::Small => SMALL_BUFFER,
            PoolKind::Large => LARGE_BUFFER,
        };
        // ExpandableSegment::size(): max_handles_ (numSegments, rounding up) pages.
        let size = times(EXPANDABLE_ADDRESS_SPACE.div_ceil(page), page);
        let base = self.next_addr;
        // Past 2^64 bytes of address space `cuMemAddressReserve` fails.
        self.next_addr = base.checked_add(size)?;
        self.segments.push(ExpandableSegment { base, page });
        let segment = self.segments.len() - 1;
        let candidate = self.new_block(Block {
            addr: base,
            size,
            prev: NIL,
            next: NIL,
            segment,
            pool,
            allocated: false,
            mapped: false,
            generation: 0,
            live: true,
        });
        self.pool_mut(pool)
            .unmapped
            .insert(addr_key(base), candidate);
        Some(candidate)
    }

    /// `map_block`: backs the first `size` bytes of the unmapped block `to_map` with pages
    /// (whole pages: `ExpandableSegment::map` rounds the end up), leaves the rest unmapped,
    /// merges the mapped part with free neighbours and caches it.
    fn map_block(&mut self, to_map: usize, size: u64) -> bool {
        let b = self.blocks[to_map];
        let Some(&ExpandableSegment { base, page }) = self.segments.get(b.segment) else {
            return false;
        };
        if b.mapped || size > b.size {
            return false;
        }
        // segmentLeft(ptr) and segmentRight(ptr + size), in pages from the segment's base.
        let offset = b.addr.saturating_sub(base);
        let begin = offset / page;
        let end = offset.saturating_add(size).div_ceil(page);
        let mapped = times(end.saturating_sub(begin), page);
        // `cuMemCreate` fails past what the device can hand out
        if mapped == 0 || self.reserved.saturating_add(mapped) > self.capacity {
            // "return size of 0 indicates OOM"
            return false;
        }
        self.pool_mut(b.pool).unmapped.remove(addr_key(b.addr));
        self.blocks[to_map].mapped = true;
        if mapped < b.size {
            // to_map -> remaining -> to_map->next
            let remaining = self.new_block(Block {
                addr: b.addr.saturating_add(mapped),
                size: b.size - mapped,
                prev: to_map,
                next: b.next,
                segment: b.segment,
                pool: b.pool,
                allocated: false,
                mapped: false,
                generation: 0,
                live: true,
            });
            if let Some(n) = self.blocks.get_mut(b.next) {
                n.prev = remaining;
            }
            self.blocks[to_map].next = remaining;
            let addr = self.blocks[remaining].addr;
            self.pool_mut(b.pool)
                .unmapped
                .insert(addr_key(addr), remaining);
            self.blocks[to_map].size = mapped;
        }
        let (prev, next) = (self.blocks[to_map].prev, self.blocks[to_map].next);
        self.try_merge_blocks(to_map, prev);
        self.try_merge_blocks(to_map, next);
        let m = self.blocks[to_map];
        self.pool_mut(m.pool)
            .blocks
            .insert(size_key(m.size, m.addr), to_map);
        self.grow_reserved(mapped);
        true
    }

    /// `try_allocate_expandable_block`: maps as many pages as `size` needs at the lowest
    /// address that can hold it, and returns the (possibly larger) free block there,
    /// taken out of the pool.
    fn try_allocate_expandable_block(&mut self, pool: Pool, size: u64) -> Option<usize> {
        let mut candidate = self.find_expandable_block(pool, size)?;
        // Candidate is a run of free/unmapped blocks with room for size:
        // unmapped -> null, unmapped -> free -> *, free -> unmapped -> *
        if !self.blocks[candidate].mapped {
            let len = self.blocks[candidate].size.min(size);
            if !self.map_block(candidate, len) {
                return None;
            }
        }
        while self.blocks[candidate].size < size {
            // invariant: free -> unmapped -> *; map_block maps some of the unmapped block
            // and merges it with the free one.
            let remaining = size - self.blocks[candidate].size;
            let next = self.blocks[candidate].next;
            let next_size = self.blocks.get(next)?.size;
            if !self.map_block(next, remaining.min(next_size)) {
                return None;
            }
            candidate = next;
        }
        let c = self.blocks[candidate];
        self.pool_mut(pool).blocks.remove(size_key(c.size, c.addr));
        Some(candidate)
    }
}

/// The pools of the first `streams` streams, each stream's large pool before its small one (`release_cached_blocks` walks
/// `large_blocks`, then `small_blocks`).
fn every_pool(streams: u8) -> impl Iterator<Item = Pool> {
    (0..streams).flat_map(|s| [Pool::of(s, PoolKind::Large), Pool::of(s, PoolKind::Small)])
}

/// `count * unit`, saturating: `saturating_mul` by a comparison, which WebAssembly spells
/// as a call to a 128-bit multiply on every allocation.
const fn times(count: u64, unit: u64) -> u64 {
    if unit != 0 && count > u64::MAX / unit {
        u64::MAX
    } else {
        count * unit
    }
}

/// `round_size`: at least `kMinBlockSize`, else up to a multiple of it (the power-of-two
/// divisions of `roundup_power2_divisions` are off by default: every division count is 0).
fn round_size(size: u64) -> u64 {
    if size < MIN_BLOCK_SIZE {
        MIN_BLOCK_SIZE
    } else {
        // `div_ceil` spelled out: by a power of two it is a shift and a mask, where
        // `u64::div_ceil` stayed a call in WebAssembly, on every `malloc`
        // (a mask: `MIN_BLOCK_SIZE` is a power of two)
        let up = u64::from(size & (MIN_BLOCK_SIZE - 1) != 0);
        times(size / MIN_BLOCK_SIZE + up, MIN_BLOCK_SIZE)
    }
}

/// `get_pool`: requests up to `kSmallSize` (after rounding) go to the small pool.
fn get_pool(size: u64) -> PoolKind {
    if size <= SMALL_SIZE {
        PoolKind::Small
    } else {
        PoolKind::Large
    }
}

/// `get_allocation_size`: the `cudaMalloc` size for a cache miss.
fn get_allocation_size(size: u64) -> u64 {
    if size <= SMALL_SIZE {
        SMALL_BUFFER
    } else if size < MIN_LARGE_ALLOC {
        LARGE_BUFFER
    } else {
        times(size.div_ceil(ROUND_LARGE), ROUND_LARGE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const KIB: u64 = 1 << 10;
    const MIB: u64 = 1 << 20;

    /// One step of a replay: allocate bytes, or free the n-th allocation of the replay.
    #[derive(Clone, Copy, Debug)]
    enum Op {
        A(u64),
        F(usize),
    }
    use Op::{A, F};

    /// Replays `ops` and returns the allocator and the ids it handed out.
    fn replay(mode: AllocatorMode, ops: &[Op]) -> (CachingAllocator, Vec<BlockId>) {
        let mut alloc = CachingAllocator::new(mode);
        let mut ids = Vec::new();
        for &op in ops {
            match op {
                A(bytes) => ids.push(alloc.malloc(bytes)),
                F(n) => {
                    if let Some(&id) = ids.get(n) {
                        alloc.free(id);
                    }
                }
            }
        }
        (alloc, ids)
    }

    /// Expected (allocated, reserved, peak allocated, peak reserved) after a replay.
    type Expect = (u64, u64, u64, u64);

    #[track_caller]
    fn check(name: &str, mode: AllocatorMode, ops: &[Op], expect: Expect) {
        let (a, _) = replay(mode, ops);
        let got = (
            a.allocated(),
            a.reserved(),
            a.peak_allocated(),
            a.peak_reserved(),
        );
        assert_eq!(got, expect, "{name} ({})", mode.key());
    }

    /// A block freed while another stream still uses it (`record_stream`) leaves
    /// `memory_allocated` at once, but serves no request until its events complete.
    #[test]
    fn a_block_in_use_on_another_stream_waits_for_its_release() {
        let mut a = CachingAllocator::new(AllocatorMode::Default);
        let x = a.malloc_on(30 << 20, 1);
        a.free_in_use(x);
        assert_eq!(a.allocated(), 0);
        let y = a.malloc_on(30 << 20, 1);
        assert_eq!(
            a.reserved(),
            60 << 20,
            "the block in use is not handed out again"
        );
        a.release(x);
        a.free(y);
        let _z = a.malloc_on(30 << 20, 1);
        assert_eq!((a.allocated(), a.reserved()), (30 << 20, 60 << 20));
        assert_eq!(a.peak_allocated(), 30 << 20);
    }

    /// Near the capacity, the OOM path completes the pending events before it releases the
    /// cached segments (`release_cached_blocks` -> `synchronize_and_free_events`): a block
    /// freed in use is handed back to the driver too, and its later release does nothing.
    #[test]
    fn running_out_completes_the_pending_events_first() {
        for mode in [AllocatorMode::Default, AllocatorMode::Expandable] {
            let mut a = CachingAllocator::new(mode);
            a.set_capacity(100 << 20);
            let x = a.malloc_on(60 << 20, 1);
            a.free_in_use(x);
            let y = a.malloc(70 << 20);
            assert!(!a.out_of_memory(), "{mode:?}");
            assert_eq!(a.allocated(), 70 << 20, "{mode:?}");
            a.release(x);
            assert_eq!(a.allocated(), 70 << 20, "{mode:?}: a second release");
            a.free(y);
            assert_eq!(a.allocated(), 0, "{mode:?}");
        }
    }

    #[test]
    fn mode_keys_round_trip() {
        for mode in AllocatorMode::ALL {
            assert_eq!(AllocatorMode::from_key(mode.key()), Some(mode));
            assert!(!mode.label().is_empty());
        }
        assert_eq!(AllocatorMode::from_key("cudaMallocAsync"), None);
        assert_eq!(AllocatorMode::default(), AllocatorMode::Default);
    }

    #[test]
    fn times_saturates_as_saturating_mul() {
        for count in [
            0,
            1,
            2,
            1 << 20,
            u64::MAX / 512,
            u64::MAX / 512 + 1,
            u64::MAX,
        ] {
            for unit in [0, 1, 512, 2 * MIB, 20 * MIB, u64::MAX] {
                assert_eq!(
                    times(count, unit),
                    count.saturating_mul(unit),
                    "{count} x {unit}"
                );
            }
        }
    }

    #[test]
    fn rounding_and_pool_boundaries() {
        // round_size: 512-byte minimum and multiple.
        assert_eq!(round_size(1), 512);
        assert_eq!(round_size(512), 512);
        assert_eq!(round_size(513), 1024);
        // get_allocation_size at the kSmallSize and kMinLargeAlloc edges.
        assert_eq!(get_allocation_size(MIB), 2 * MIB);
        assert_eq!(get_allocation_size(MIB + 512), 20 * MIB);
        assert_eq!(get_allocation_size(10 * MIB - 512), 20 * MIB);
        assert_eq!(get_allocation_size(10 * MIB), 10 * MIB);
        assert_eq!(get_allocation_size(10 * MIB + 512), 12 * MIB);
        assert_eq!(get_pool(MIB), PoolKind::Small);
        assert_eq!(get_pool(MIB + 512), PoolKind::Large);
    }

    #[test]
    fn replays_match_the_source() {
        use AllocatorMode::{Default as D, Expandable as E};
        #[rustfmt::skip]
        let cases: &[(&str, AllocatorMode, &[Op], Expect)] = &[
            ("1 B rounds to 512", D, &[A(1)], (512, 2 * MIB, 512, 2 * MIB)),
            ("513 B rounds to 1024", D, &[A(513)], (1024, 2 * MIB, 1024, 2 * MIB)),
            ("1 B rounds to 512", E, &[A(1)], (512, 2 * MIB, 512, 2 * MIB)),
            ("0 B allocates nothing", D, &[A(0)], (0, 0, 0, 0)),
            ("1 EiB is refused", D, &[A(1 << 60)], (0, 0, 0, 0)),
            // 1024 + 200_192 + 1 MiB all fit one 2 MiB small segment (page).
            ("small requests share a segment", D, &[A(1000), A(200_000), A(MIB)],
                (1_249_792, 2 * MIB, 1_249_792, 2 * MIB)),
            ("small requests share a page", E, &[A(1000), A(200_000), A(MIB)],
                (1_249_792, 2 * MIB, 1_249_792, 2 * MIB)),
            ("a 2nd segment when the first is full", D, &[A(MIB), A(MIB), A(512)],
                (2 * MIB + 512, 4 * MIB, 2 * MIB + 512, 4 * MIB)),
            // 1 MiB + 512 is large: a 20 MiB segment.
            ("just above kSmallSize", D, &[A(MIB + 1)], (MIB + 512, 20 * MIB, MIB + 512, 20 * MIB)),
            ("small and large pools apart", D, &[A(KIB), A(5 * MIB)],
                (5 * MIB + KIB, 22 * MIB, 5 * MIB + KIB, 22 * MIB)),
            ("small and large segments apart", E, &[A(KIB), A(5 * MIB)],
                (5 * MIB + KIB, 22 * MIB, 5 * MIB + KIB, 22 * MIB)),
            ("5 MiB takes a 20 MiB segment", D, &[A(5 * MIB)], (5 * MIB, 20 * MIB, 5 * MIB, 20 * MIB)),
            ("a 2nd 5 MiB reuses the remainder", D, &[A(5 * MIB), A(5 * MIB)],
                (10 * MIB, 20 * MIB, 10 * MIB, 20 * MIB)),
            ("a 2nd 5 MiB reuses the page", E, &[A(5 * MIB), A(5 * MIB)],
                (10 * MIB, 20 * MIB, 10 * MIB, 20 * MIB)),
            ("50 MiB takes 50 MiB", D, &[A(50 * MIB)], (50 * MIB, 50 * MIB, 50 * MIB, 50 * MIB)),
            ("50 MiB + 1 B takes 52 MiB", D, &[A(50 * MIB + 1)],
                (50 * MIB + 512, 52 * MIB, 50 * MIB + 512, 52 * MIB)),
            ("50 MiB maps three 20 MiB pages", E, &[A(50 * MIB)],
                (50 * MIB, 60 * MIB, 50 * MIB, 60 * MIB)),
            ("10 MiB - 512 still takes 20 MiB", D, &[A(10 * MIB - 512)],
                (10 * MIB - 512, 20 * MIB, 10 * MIB - 512, 20 * MIB)),
            ("10 MiB - 1 rounds to 10 MiB: its own segment", D, &[A(10 * MIB - 1)],
                (10 * MIB, 10 * MIB, 10 * MIB, 10 * MIB)),
            // should_split: a large-pool remainder of 1 MiB is not split off, so the block
            // (and memory_allocated) is the whole 20 MiB segment; expandable splits >= 512.
            ("unsplit remainder counts as allocated", D, &[A(19 * MIB)],
                (20 * MIB, 20 * MIB, 20 * MIB, 20 * MIB)),
            ("expandable splits any remainder", E, &[A(19 * MIB)],
                (19 * MIB, 20 * MIB, 19 * MIB, 20 * MIB)),
            // free_block merges freed neighbours, so 15 MiB fits where three 5 MiB were.
            ("freed neighbours merge", D,
                &[A(5 * MIB), A(5 * MIB), A(5 * MIB), F(0), F(2), F(1), A(15 * MIB)],
                (15 * MIB, 20 * MIB, 15 * MIB, 20 * MIB)),
            ("freed neighbours merge", E,
                &[A(5 * MIB), A(5 * MIB), A(5 * MIB), F(0), F(2), F(1), A(15 * MIB)],
                (15 * MIB, 20 * MIB, 15 * MIB, 20 * MIB)),
            // Two 5 MiB holes apart: 10 MiB needs a new 10 MiB segment.
            ("holes apart do not merge", D,
                &[A(5 * MIB), A(5 * MIB), A(5 * MIB), A(5 * MIB), F(0), F(2), A(10 * MIB)],
                (20 * MIB, 30 * MIB, 20 * MIB, 30 * MIB)),
            // ... and expandable maps a whole new 20 MiB page for it.
            ("holes apart do not merge", E,
                &[A(5 * MIB), A(5 * MIB), A(5 * MIB), A(5 * MIB), F(0), F(2), A(10 * MIB)],
                (20 * MIB, 40 * MIB, 20 * MIB, 40 * MIB)),
            // Note [Expandable Segments]: growing sizes leave every earlier segment too small.
            ("growing sizes fragment", D,
                &[A(12 * MIB), F(0), A(14 * MIB), F(1), A(16 * MIB), F(2), A(18 * MIB)],
                (18 * MIB, 60 * MIB, 18 * MIB, 60 * MIB)),
            ("growing sizes fit one page", E,
                &[A(12 * MIB), F(0), A(14 * MIB), F(1), A(16 * MIB), F(2), A(18 * MIB)],
                (18 * MIB, 20 * MIB, 18 * MIB, 20 * MIB)),
            // No bound on expandable over default holds: here the 2 MiB request lands in the
            // page after the 71 MiB block (the default puts it in a 20 MiB segment of its own),
            // so 72 MiB cannot reuse the freed 71 MiB and maps four new pages.
            ("expandable can reserve far more", D,
                &[A(71 * MIB), A(2 * MIB), F(0), A(72 * MIB)],
                (74 * MIB, 92 * MIB, 74 * MIB, 92 * MIB)),
            ("expandable can reserve far more", E,
                &[A(71 * MIB), A(2 * MIB), F(0), A(72 * MIB)],
                (74 * MIB, 160 * MIB, 74 * MIB, 160 * MIB)),
            ("peaks stay after frees", D,
                &[A(3 * MIB), A(3 * MIB), F(0), F(1), A(KIB)],
                (KIB, 22 * MIB, 6 * MIB, 22 * MIB)),
            ("peaks stay after frees", E,
                &[A(3 * MIB), A(3 * MIB), F(0), F(1), A(KIB)],
                (KIB, 22 * MIB, 6 * MIB, 22 * MIB)),
            ("freeing twice is a no-op", D, &[A(MIB), A(KIB), F(0), F(0)],
                (KIB, 2 * MIB, MIB + KIB, 2 * MIB)),
            ("freeing twice is a no-op", E, &[A(MIB), A(KIB), F(0), F(0)],
                (KIB, 2 * MIB, MIB + KIB, 2 * MIB)),
            // The slot of block 0 is handed out again; its old id must not free it.
            ("a stale id frees nothing", D, &[A(KIB), A(KIB), F(0), A(KIB), F(0)],
                (2 * KIB, 2 * MIB, 2 * KIB, 2 * MIB)),
            ("freeing a 0-byte request is a no-op", D, &[A(KIB), A(0), F(1)],
                (KIB, 2 * MIB, KIB, 2 * MIB)),
        ];
        for &(name, mode, ops, expect) in cases {
            check(name, mode, ops, expect);
        }
    }

    #[test]
    fn a_device_releases_its_cached_segments_before_running_out() {
        const MIB: u64 = 1 << 20;
        let mut a = CachingAllocator::new(AllocatorMode::Default);
        a.set_capacity(100 * MIB);
        let first = a.malloc(60 * MIB);
        a.free(first);
        assert_eq!(a.reserved(), 60 * MIB);
        // 60 + 70 MiB would pass the capacity: the cached 60 MiB segment goes back first
        let second = a.malloc(70 * MIB);
        assert_eq!((a.reserved(), a.out_of_memory()), (70 * MIB, false));
        // nothing cached is left to release: 70 + 40 MiB does not fit
        let third = a.malloc(40 * MIB);
        assert!(a.out_of_memory());
        a.free(second);
        a.free(third);
        // an infinite device never releases: 60 + 70 MiB reserved
        let mut b = CachingAllocator::new(AllocatorMode::Default);
        let first = b.malloc(60 * MIB);
        b.free(first);
        b.malloc(70 * MIB);
        assert_eq!((b.reserved(), b.out_of_memory()), (130 * MIB, false));
    }

    #[test]
    fn expandable_segments_unmap_their_free_pages_before_running_out() {
        const MIB: u64 = 1 << 20;
        let steps = |capacity: Option<u64>| {
            let mut a = CachingAllocator::new(AllocatorMode::Expandable);
            if let Some(c) = capacity {
                a.set_capacity(c);
            }
            let first = a.malloc(60 * MIB);
            let _second = a.malloc(60 * MIB);
            // a 60 MiB hole before the second tensor: too small for the next one
            a.free(first);
            let _third = a.malloc(100 * MIB);
            (a.reserved(), a.allocated(), a.out_of_memory())
        };
        // an infinite device maps 100 MiB more past the hole
        assert_eq!(steps(None), (220 * MIB, 160 * MIB, false));
        // at 200 MiB the hole's pages are unmapped first
        assert_eq!(steps(Some(200 * MIB)), (160 * MIB, 160 * MIB, false));
        // at 150 MiB even that does not fit: mapped anyway, and said
        assert_eq!(steps(Some(150 * MIB)), (160 * MIB, 160 * MIB, true));
    }

    #[test]
    fn a_stream_reuses_only_its_own_cached_blocks() {
        for mode in AllocatorMode::ALL {
            let mut a = CachingAllocator::new(mode);
            let gathered = a.malloc_on(100 << 20, 1);
            a.free(gathered);
            // the default stream cannot take the all-gather stream's cached block
            let x = a.malloc(100 << 20);
            assert_eq!(a.reserved(), 200 << 20, "{mode:?}");
            // the all-gather stream takes it back, whichever stream freed it
            let y = a.malloc_on(100 << 20, 1);
            assert_eq!(a.reserved(), 200 << 20, "{mode:?}");
            a.free(x);
            a.free(y);
            assert_eq!((a.allocated(), a.peak_allocated()), (0, 200 << 20));
            // a stream past the last shares its pools
            let last = a.malloc_on(100 << 20, STREAMS as u8 - 1);
            a.free(last);
            let z = a.malloc_on(100 << 20, 200);
            assert_eq!(a.reserved(), 300 << 20, "{mode:?}");
            a.free(z);
        }
    }

    #[test]
    fn unknown_ids_free_nothing() {
        let mut a = CachingAllocator::new(AllocatorMode::Default);
        let id = a.malloc(KIB);
        a.free(BlockId::NULL);
        a.free(BlockId {
            slot: 99,
            generation: 1,
        });
        a.free(BlockId {
            slot: id.slot,
            generation: id.generation.wrapping_add(1),
        });
        assert_eq!(a.allocated(), KIB);
        a.free(id);
        assert_eq!(a.allocated(), 0);
    }

    #[test]
    fn huge_requests_do_not_panic() {
        for mode in AllocatorMode::ALL {
            let mut a = CachingAllocator::new(mode);
            let ids: Vec<BlockId> = (0..40).map(|i| a.malloc(ONE_EXA_BYTES - 1 - i)).collect();
            // The address space (2^64 bytes) holds fewer than 16 of them; the rest fail.
            let held = ids.iter().filter(|&&id| id != BlockId::NULL).count() as u64;
            assert!((4..16).contains(&held), "{held} ({})", mode.key());
            assert_eq!(a.allocated(), held * round_size(ONE_EXA_BYTES - 40));
            assert!(a.allocated() <= a.reserved());
            for id in ids {
                a.free(id);
            }
            a.malloc(u64::MAX);
            a.malloc(1);
        }
    }

    /// A request size: mostly small and mid-sized, sometimes tens of MiB.
    fn request() -> impl Strategy<Value = u64> {
        prop_oneof![
            4 => 1..=2 * MIB,
            4 => MIB..=24 * MIB,
            1 => 24 * MIB..=200 * MIB,
        ]
    }

    /// Allocate (with a size) or free (the live allocation picked by an index).
    fn ops() -> impl Strategy<Value = Vec<(bool, u64, usize)>> {
        proptest::collection::vec(
            (proptest::bool::weighted(0.6), request(), any::<usize>()),
            0..200,
        )
    }

    /// Replays random ops, checking after every step what the source guarantees.
    fn run_checked(mode: AllocatorMode, ops: &[(bool, u64, usize)]) -> CachingAllocator {
        let mut a = CachingAllocator::new(mode);
        let mut live: Vec<(BlockId, u64, bool)> = Vec::new();
        let (mut rounded, mut max_rounded, mut last_reserved) = (0u64, 0u64, 0u64);
        for &(alloc, bytes, pick) in ops {
            if alloc || live.is_empty() {
                let id = a.malloc(bytes);
                let size = round_size(bytes);
                live.push((id, size, get_pool(size) == PoolKind::Large));
                rounded += size;
            } else {
                let (id, size, _) = live.swap_remove(pick % live.len());
                a.free(id);
                rounded -= size;
            }
            max_rounded = max_rounded.max(rounded);
            let large_live = live.iter().filter(|l| l.2).count() as u64;
            match mode {
                // Expandable: should_split splits any remainder >= 512, and every size
                // is a multiple of 512, so each block is exactly its rounded size.
                AllocatorMode::Expandable => assert_eq!(a.allocated(), rounded),
                // Default: a large block keeps a remainder of at most kSmallSize.
                AllocatorMode::Default => {
                    assert!(a.allocated() >= rounded);
                    assert!(a.allocated() <= rounded + large_live * SMALL_SIZE);
                }
            }
            assert!(a.allocated() <= a.reserved());
            assert!(a.reserved() >= last_reserved, "reserved never shrinks");
            assert_eq!(
                a.reserved() % SMALL_BUFFER,
                0,
                "segments and pages are 2 MiB multiples"
            );
            assert_eq!(a.peak_reserved(), a.reserved());
            assert!(a.peak_allocated() >= a.allocated());
            last_reserved = a.reserved();
        }
        if mode == AllocatorMode::Expandable {
            assert_eq!(a.peak_allocated(), max_rounded);
        } else {
            assert!(a.peak_allocated() >= max_rounded);
        }
        for (id, _, _) in live {
            a.free(id);
        }
        assert_eq!(a.allocated(), 0);
        a
    }

    // Not asserted: that expandable segments never reserve more than the default plus a page
    // per pool. The source promises no such bound, and the case "expandable can reserve far
    // more" above breaks it by 68 MiB.
    proptest! {
        #[test]
        fn random_replays_keep_the_invariants(ops in ops()) {
            for mode in AllocatorMode::ALL {
                run_checked(mode, &ops);
            }
        }
    }

    /// A training-step-like trace of `n` events: activations kept for backward, freed in
    /// reverse, with short-lived temporaries in between. Deterministic (an LCG).
    fn step_trace(n: usize) -> Vec<Op> {
        let mut state: u64 = 0x2545_F491_4F6C_DD1D;
        let mut next = move || {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1);
            state >> 33
        };
        let mut ops = Vec::with_capacity(n);
        let mut saved = Vec::new();
        let mut allocs = 0usize;
        while ops.len() < n {
            let r = next();
            let bytes = match r % 8 {
                0..=3 => 1 + r % (512 * KIB),
                4..=6 => MIB + r % (16 * MIB),
                _ => 16 * MIB + r % (64 * MIB),
            };
            ops.push(A(bytes));
            let id = allocs;
            allocs += 1;
            if r % 3 == 0 {
                ops.push(F(id)); // a temporary
            } else {
                saved.push(id);
            }
            if ops.len() >= n / 2 {
                while let Some(id) = saved.pop() {
                    if ops.len() >= n {
                        break;
                    }
                    ops.push(F(id));
                }
            }
        }
        ops.truncate(n);
        ops
    }

    /// `cargo test --release -p estimator-core --lib allocator::tests::timing -- --ignored --nocapture`
    #[test]
    #[ignore = "timing, run by hand in release"]
    fn timing_of_5000_events() {
        let ops = step_trace(5_000);
        for mode in AllocatorMode::ALL {
            // The fastest of many rounds: the machine is shared, and contention only adds.
            let mut per = std::time::Duration::MAX;
            let mut peak = 0;
            for _ in 0..300 {
                let start = std::time::Instant::now();
                let (a, _) = replay(mode, std::hint::black_box(&ops));
                per = per.min(start.elapsed());
                peak = a.peak_reserved();
            }
            println!(
                "{}: {per:?} per 5,000-event replay (peak reserved {peak} B)",
                mode.key()
            );
        }
    }
}
