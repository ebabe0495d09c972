//! A consumer that waits keeps its wait inline: polling a `get` or a stream
//! on an empty queue allocates nothing once the queue's waiter table has
//! room (it used to box a future on every pending poll of a stream).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use futures::Stream;
use tokio_workqueue::WorkQueue;

/// Counts the allocations of the thread that asks.
struct Counting;

thread_local! {
    static ALLOCS: Cell<usize> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // `try_with`: the thread-local may be gone while a thread exits.
        let _ = ALLOCS.try_with(|n| n.set(n.get() + 1));
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations_in(f: impl FnOnce()) -> usize {
    let before = ALLOCS.with(Cell::get);
    f();
    ALLOCS.with(Cell::get) - before
}

#[test]
fn waiting_streams_and_gets_allocate_nothing() {
    let queue: WorkQueue<u32> = WorkQueue::new();
    let mut cx = Context::from_waker(Waker::noop());
    // Warm-up: the waiter table grows to two places once.
    {
        let mut a = queue.clone();
        let b = queue.clone();
        let mut get = pin!(b.get());
        assert!(Stream::poll_next(std::pin::Pin::new(&mut a), &mut cx).is_pending());
        assert!(get.as_mut().poll(&mut cx).is_pending());
    }
    let mut stream = queue.clone();
    let n = allocations_in(|| {
        for _ in 0..100 {
            // Registers, then polls again as a registered waiter.
            assert!(Stream::poll_next(std::pin::Pin::new(&mut stream), &mut cx).is_pending());
            assert!(Stream::poll_next(std::pin::Pin::new(&mut stream), &mut cx).is_pending());
            let mut get = pin!(queue.get());
            assert!(get.as_mut().poll(&mut cx).is_pending());
            assert!(get.as_mut().poll(&mut cx).is_pending());
        }
    });
    assert_eq!(n, 0, "allocations while waiting");
    // And the waits still work: a key wakes the stream's wait.
    queue.add(7).unwrap();
    match Stream::poll_next(std::pin::Pin::new(&mut stream), &mut cx) {
        Poll::Ready(Some(item)) => assert_eq!(*item, 7),
        other => panic!("expected the key, got {:?}", other.map(|i| i.map(|i| *i))),
    }
}
