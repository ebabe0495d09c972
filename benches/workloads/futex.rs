//! Counts the futex system calls the benchmark process makes, through the
//! kernel's `syscalls:sys_enter_futex` tracepoint (`perf_event_open`, the
//! counter inherited by every thread created after it is opened, so each
//! run's fresh runtime threads are counted).
//!
//! Needs tracepoint access (root, or `perf_event_paranoid` <= 1) and a
//! mounted tracefs (`perf stat -e syscalls:sys_enter_futex true` mounts it
//! at /sys/kernel/tracing), on Linux x86_64 or aarch64; without it
//! [`FutexCounter::open`] says why and the figure is left out rather than
//! printed as zero.

use std::fs::File;
use std::io::Read;
use std::os::fd::FromRawFd;

unsafe extern "C" {
    /// libc's `syscall`, which std links on Linux anyway: this spares the
    /// benchmark (and the kube crate's, which shares this file) a `libc`
    /// dependency.
    fn syscall(number: i64, ...) -> i64;
}

#[cfg(target_arch = "x86_64")]
const SYS_PERF_EVENT_OPEN: i64 = 298;
#[cfg(target_arch = "aarch64")]
const SYS_PERF_EVENT_OPEN: i64 = 241;

/// `struct perf_event_attr` up to `config1` (`PERF_ATTR_SIZE_VER0`), all
/// the kernel needs for a counting tracepoint.
#[repr(C)]
#[derive(Default)]
struct PerfEventAttr {
    kind: u32,
    size: u32,
    config: u64,
    sample_period: u64,
    sample_type: u64,
    read_format: u64,
    /// Bit 0 `disabled`, bit 1 `inherit`, ...
    flags: u64,
    wakeup_events: u32,
    bp_type: u32,
    config1: u64,
}

const PERF_TYPE_TRACEPOINT: u32 = 2;
const INHERIT: u64 = 1 << 1;

/// An open futex counter for this process and the threads it starts.
pub struct FutexCounter {
    fd: File,
}

impl FutexCounter {
    /// Opens the counter, or says why it cannot.
    #[cfg(all(
        target_os = "linux",
        any(target_arch = "x86_64", target_arch = "aarch64")
    ))]
    pub fn open() -> Result<Self, String> {
        let id = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"]
            .iter()
            .find_map(|root| {
                std::fs::read_to_string(format!("{root}/events/syscalls/sys_enter_futex/id")).ok()
            })
            .ok_or("no readable syscalls:sys_enter_futex tracepoint (tracefs)")?;
        let config: u64 = id
            .trim()
            .parse()
            .map_err(|e| format!("tracepoint id: {e}"))?;
        let attr = PerfEventAttr {
            kind: PERF_TYPE_TRACEPOINT,
            size: size_of::<PerfEventAttr>() as u32,
            config,
            flags: INHERIT,
            ..PerfEventAttr::default()
        };
        // SAFETY: perf_event_open reads `attr` (valid, `size` bytes) and
        // returns a new file descriptor or -1; nothing else is touched.
        let fd = unsafe {
            syscall(
                SYS_PERF_EVENT_OPEN,
                &attr as *const PerfEventAttr,
                0i32,  // this process
                -1i32, // any CPU
                -1i32, // no group
                0u64,
            )
        };
        if fd < 0 {
            return Err(format!(
                "perf_event_open: {}",
                std::io::Error::last_os_error()
            ));
        }
        // SAFETY: a descriptor just returned to us, owned from here on.
        Ok(FutexCounter {
            fd: unsafe { File::from_raw_fd(fd as i32) },
        })
    }

    /// Opens the counter, or says why it cannot.
    #[cfg(not(all(
        target_os = "linux",
        any(target_arch = "x86_64", target_arch = "aarch64")
    )))]
    pub fn open() -> Result<Self, String> {
        Err("futex counting needs Linux on x86_64 or aarch64".into())
    }

    /// Futex calls so far by this process and its threads that have exited
    /// (an inherited counter adds a thread's count when it exits), plus the
    /// calling thread's.
    pub fn read(&mut self) -> u64 {
        let mut buf = [0u8; 8];
        match self.fd.read_exact(&mut buf) {
            Ok(()) => u64::from_ne_bytes(buf),
            Err(_) => 0,
        }
    }
}
