//! Nothing allocated on the fast path: once a communicator is warm, a blocking small
//! collective allocates no heap memory in the calling thread (a counting global allocator
//! shows it exactly, where times would only hint at it).

use oxccl::{Communicator, ReduceOp};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

struct Counting;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: every call is forwarded to the system allocator unchanged; the count is a
// const-initialised thread-local Cell, which neither allocates nor can re-enter the allocator.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.with(|a| a.set(a.get() + 1));
        // SAFETY: the caller's layout, passed through
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        ALLOCS.with(|a| a.set(a.get() + 1));
        // SAFETY: as above
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        ALLOCS.with(|a| a.set(a.get() + 1));
        // SAFETY: a block of this allocator with its layout, passed through
        unsafe { System.realloc(p, l, n) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: a block of this allocator with its layout, passed through
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static A: Counting = Counting;

fn allocs() -> u64 {
    ALLOCS.with(Cell::get)
}

#[test]
fn a_warm_blocking_all_reduce_allocates_nothing() {
    let comm = Communicator::init_all(1).unwrap().pop().unwrap();
    let (a, mut b) = ([1.0f32, 2.0], [0.0f32; 2]);
    let mut inplace = [3u64; 4];
    for _ in 0..10 {
        comm.all_reduce(&a, &mut b, ReduceOp::Sum).unwrap();
        comm.all_reduce_inplace(&mut inplace, ReduceOp::Max).unwrap();
    }
    let before = allocs();
    for _ in 0..1000 {
        comm.all_reduce(&a, &mut b, ReduceOp::Sum).unwrap();
        comm.all_reduce_inplace(&mut inplace, ReduceOp::Max).unwrap();
    }
    let per_call = (allocs() - before) as f64 / 2000.0;
    assert_eq!(allocs() - before, 0, "{per_call} heap allocations per blocking all-reduce");
    assert_eq!((b, inplace), ([1.0, 2.0], [3; 4]));
}
