//! The page's memory allocator: blocks of power-of-two sizes, each size with its own free
//! list, carved from memory the module grows.
//!
//! Why not the standard library's (dlmalloc): it is some 8 KB of WebAssembly (0.8 KB of the
//! gzipped bundle more than this one), and its coalescing buys nothing here. The
//! page allocates the same shapes over and over (one estimate per keystroke), so a freed
//! block is soon wanted again at its own size; a block is never split or merged, which makes
//! allocating and freeing a few instructions each. The price is the rounding (a request is
//! at most twice its size) and that memory freed at one size is reused at that size only:
//! the heap holds the largest number of blocks of each size ever alive at once, a few MB.
//!
//! Only for `wasm32` (one thread: the module is built without atomics).

use std::alloc::{GlobalAlloc, Layout};
use std::cell::UnsafeCell;
use std::ptr::null_mut;

/// WebAssembly's page: the unit `memory.grow` counts in.
const PAGE_BYTES: usize = 65_536;
/// The smallest block: room for the free list's link.
const MIN_BLOCK_BYTES: usize = 8;
/// Pages grown at least at once, so that small blocks do not grow the memory one page at a
/// time.
const MIN_GROW_PAGES: usize = 16;

struct Heap {
    /// The first free block of each size class (2^class bytes), 0 for none; a free block
    /// holds the address of the next one.
    free: [usize; usize::BITS as usize],
    /// Where the next new block may start.
    next: usize,
    /// The end of the memory carved from (`next` never passes it).
    end: usize,
}

/// A size-class allocator for the page (see the module's comment).
pub struct SizeClasses(UnsafeCell<Heap>);

// SAFETY: the page's module runs on one thread (wasm32 without atomics): the heap is never
// touched by two threads.
unsafe impl Sync for SizeClasses {}

impl SizeClasses {
    /// An empty heap: the first allocation grows the memory.
    #[must_use]
    pub const fn new() -> Self {
        Self(UnsafeCell::new(Heap {
            free: [0; usize::BITS as usize],
            next: 0,
            end: 0,
        }))
    }
}

impl Default for SizeClasses {
    fn default() -> Self {
        Self::new()
    }
}

/// The size class of `layout`: blocks of 2^class bytes, at least its size and its alignment
/// (a block is aligned to its size up to a page, so a block of the class suits any layout of
/// the class); `None` past the address space.
fn class(layout: Layout) -> Option<usize> {
    let bytes = layout
        .size()
        .max(layout.align())
        .max(MIN_BLOCK_BYTES)
        .checked_next_power_of_two()?;
    Some(bytes.trailing_zeros() as usize)
}

impl Heap {
    /// A new block of 2^`class` bytes past the blocks made so far, growing the memory when
    /// needed; null when the memory cannot grow.
    fn carve(&mut self, class: usize) -> *mut u8 {
        let bytes = 1usize << class;
        let align = bytes.min(PAGE_BYTES);
        let fits = |next: usize, end: usize| {
            let start = next.checked_add(align - 1)? & !(align - 1);
            let stop = start.checked_add(bytes)?;
            (stop <= end).then_some((start, stop))
        };
        if let Some((start, stop)) = fits(self.next, self.end) {
            self.next = stop;
            return start as *mut u8;
        }
        let Some(want) = bytes.checked_add(align) else {
            return null_mut();
        };
        let pages = want.div_ceil(PAGE_BYTES).max(MIN_GROW_PAGES);
        let previous = grow(pages);
        if previous == usize::MAX {
            return null_mut();
        }
        let grown_from = previous.saturating_mul(PAGE_BYTES);
        if grown_from != self.end {
            // memory grown by someone else (or the first block): start in the new pages
            self.next = grown_from;
        }
        // (4 GiB of memory would end one past the address space)
        self.end = grown_from.saturating_add(pages.saturating_mul(PAGE_BYTES));
        match fits(self.next, self.end) {
            Some((start, stop)) => {
                self.next = stop;
                start as *mut u8
            }
            None => null_mut(),
        }
    }
}

#[cfg(target_arch = "wasm32")]
fn grow(pages: usize) -> usize {
    core::arch::wasm32::memory_grow::<0>(pages)
}

#[cfg(not(target_arch = "wasm32"))]
fn grow(_pages: usize) -> usize {
    usize::MAX
}

// SAFETY: a block is handed out once until it is freed (it leaves its free list, or is
// carved from memory no block covers), is at least the layout's size and aligned to it (the
// class covers both; a block sits at a multiple of its size, or of a page for larger ones,
// and alignments beyond a page make no class here: they fail as out of memory).
unsafe impl GlobalAlloc for SizeClasses {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.align() > PAGE_BYTES {
            return null_mut();
        }
        let Some(class) = class(layout) else {
            return null_mut();
        };
        // SAFETY: one thread, and no reference to the heap outlives this call.
        let heap = unsafe { &mut *self.0.get() };
        let head = heap.free[class];
        if head == 0 {
            return heap.carve(class);
        }
        // SAFETY: a free block of this class holds the next free block's address.
        heap.free[class] = unsafe { *(head as *const usize) };
        head as *mut u8
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let Some(class) = class(layout) else { return };
        // SAFETY: one thread, and no reference to the heap outlives this call.
        let heap = unsafe { &mut *self.0.get() };
        // SAFETY: `ptr` is a block of this class (the caller's layout is the one it was
        // allocated with), at least 8 bytes and aligned to them: it holds the link now.
        unsafe { *(ptr as *mut usize) = heap.free[class] };
        heap.free[class] = ptr as usize;
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller guarantees a valid size for the alignment.
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        if class(layout) == class(new_layout) {
            // the block already holds the new size
            return ptr;
        }
        // SAFETY: as for `alloc`; the old block is copied and freed only once the new one
        // exists.
        unsafe {
            let new = self.alloc(new_layout);
            if !new.is_null() {
                std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                self.dealloc(ptr, layout);
            }
            new
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_cover_size_and_alignment() {
        let c = |size, align| class(Layout::from_size_align(size, align).unwrap());
        assert_eq!(c(1, 1), Some(3));
        assert_eq!(c(8, 8), Some(3));
        assert_eq!(c(9, 1), Some(4));
        assert_eq!(c(4, 64), Some(6));
        assert_eq!(c(65_536, 8), Some(16));
        assert_eq!(c(usize::MAX / 2 + 2, 1), None);
    }
}
