//! Whether the current tokio runtime can time a delay.
//!
//! tokio has no public "has a time driver" query, and a runtime built
//! without `enable_time` panics ("timers are disabled") on the first timer
//! made in it: had the queue started its timer task there, the task would
//! have died on its first poll, after the add had said `Ok`, and the key
//! would have waited forever. So before a timer task is started the queue
//! makes one throwaway `Sleep` here and catches its panic.
//!
//! Cost: this runs only when a timer task must be started (the first
//! delayed add of a queue on a runtime), never on the hot path. Measured in
//! release on a current-thread runtime: a queue's first delayed add took
//! about 220 ns against 190 before; 200,000 adds with the task running,
//! about 105 ns each either way (within the machine's noise). On a runtime
//! without time it runs on every refused delayed add, and the default panic
//! hook prints tokio's message each time: a misconfiguration worth seeing.
//! With `panic = "abort"` the process aborts there instead of losing the
//! key.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Duration;

use tokio::runtime::Handle;

use crate::AddError;

/// The current runtime's handle, if there is a runtime and it has a time
/// driver; [`AddError::NoRuntime`] otherwise.
pub(crate) fn timed_handle() -> Result<Handle, AddError> {
    let handle = Handle::try_current().map_err(|_| AddError::NoRuntime)?;
    // `sleep` asks the context's time driver when it is made, not polled.
    catch_unwind(AssertUnwindSafe(|| {
        drop(tokio::time::sleep(Duration::ZERO))
    }))
    .map_err(|_| AddError::NoRuntime)?;
    Ok(handle)
}
