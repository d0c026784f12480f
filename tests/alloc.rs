//! Allocation counts that do not depend on the machine, measured with a counting global allocator.
//! Everything runs in one test function so that no other test thread allocates meanwhile.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

use redlock_mux::resp::{Decoder, Frame, Limits, Status};

struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations_during(f: impl FnOnce()) -> u64 {
    let before = ALLOCATIONS.load(Ordering::SeqCst);
    f();
    ALLOCATIONS.load(Ordering::SeqCst) - before
}

#[test]
fn decoding_replies_allocates_nothing() {
    let replies: &[&[u8]] = &[
        b"+OK\r\n",
        b"$-1\r\n",
        b"_\r\n",
        b":1\r\n",
        b":0\r\n",
        b"-NOSCRIPT No matching script. Please use EVAL.\r\n",
        b"$27\r\nabcdefghijklmnopqrstuvwxyz0\r\n",
        b"*3\r\n:1\r\n$2\r\nhi\r\n*1\r\n+OK\r\n",
        b"%1\r\n+server\r\n+redis\r\n",
    ];
    let mut decoder = Decoder::new(Limits::CLIENT);
    let n = allocations_during(|| {
        for _ in 0..1000 {
            for wire in replies {
                match decoder.decode(std::hint::black_box(wire)) {
                    Ok(Status::Complete((frame, used))) => {
                        assert_eq!(used, wire.len());
                        if let Frame::Aggregate(agg) = frame {
                            assert_eq!(agg.iter().count(), agg.len());
                        }
                    }
                    other => panic!("{other:?}"),
                }
            }
        }
    });
    assert_eq!(n, 0, "allocations while decoding 9000 replies");
}
