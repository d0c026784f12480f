//! A global allocator that counts: allocations and bytes for the whole process, and allocations
//! per thread (so that parallel tests do not disturb each other's counts).
//!
//! ```
//! use redis_local::CountingAlloc;
//!
//! #[global_allocator]
//! static GLOBAL: CountingAlloc = CountingAlloc;
//!
//! fn main() {
//!     let n = CountingAlloc::on_this_thread_during(|| {
//!         std::hint::black_box(vec![1u8; 10]);
//!     });
//!     assert_eq!(n, 1);
//! }
//! ```

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

/// The system allocator, counting every `alloc` and `realloc` (not `dealloc`). Install it with
/// `#[global_allocator]`; the counts stay 0 otherwise.
#[derive(Debug, Clone, Copy, Default)]
pub struct CountingAlloc;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static THREAD_ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn count(bytes: usize) {
    ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    BYTES.fetch_add(bytes as u64, Ordering::Relaxed);
    // try_with: the allocator may run while this thread's locals are being torn down.
    let _ = THREAD_ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
}

impl CountingAlloc {
    /// Allocations (including reallocations) in the whole process so far.
    pub fn allocations() -> u64 {
        ALLOCATIONS.load(Ordering::SeqCst)
    }

    /// Bytes asked for by those allocations (a reallocation counts its new size).
    pub fn bytes() -> u64 {
        BYTES.load(Ordering::SeqCst)
    }

    /// Allocations made by the calling thread so far.
    pub fn thread_allocations() -> u64 {
        THREAD_ALLOCATIONS.with(Cell::get)
    }

    /// How many allocations the calling thread makes while running `f`.
    pub fn on_this_thread_during(f: impl FnOnce()) -> u64 {
        let before = CountingAlloc::thread_allocations();
        f();
        CountingAlloc::thread_allocations() - before
    }
}

// SAFETY: every call is forwarded unchanged to the system allocator; counting touches only
// atomics and a const-initialised thread local without a destructor, neither of which allocates.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: the caller's contract for `alloc` is passed on as it is.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above, for `dealloc`.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size);
        // SAFETY: as above, for `realloc`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}
