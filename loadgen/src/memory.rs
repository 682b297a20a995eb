//! How loadgen's memory meets the host: nothing that one phase frees or the process
//! leaves at exit may come back as host steal inside a measured window.
//!
//! Owns: the process-wide allocator and transparent-huge-page settings, set once at the
//! start of `main`. Must not touch: anything measured.
//!
//! Why: on a virtual machine with free page reporting (virtio-balloon `REPORTING`,
//! `page_reporting_order` 9) the guest kernel passes freed 2 MiB blocks on to the host
//! every 2 s, and each pass of 100–200 MiB stops the vCPUs for 10–30 ms.
//! - mimalloc purges freed memory after a delay by default: what one phase freed (an
//!   overloaded official client's backlog, a runtime's teardown) would be reported inside
//!   the next phase's window. Freed memory stays in the process for reuse instead.
//! - mimalloc asks for transparent huge pages (`MADV_HUGEPAGE`), so every 2 MiB region a
//!   run touches becomes resident whole (a `--client raw --rate 1000` run: 67 MB resident,
//!   60 MB of it huge pages, against 15–20 MB without), and at exit each one is a free 2 MiB
//!   block, reported at once: 200 MiB after every `--compare --rate 67000` run, which
//!   landed in the first seconds of the next run's engine window. With 4 KiB pages a run
//!   touches less, and what it frees at exit is not reported (0 MiB after the same run).

/// mimalloc's `mi_option_purge_delay`: 15 in both the v2 and the v3 `mimalloc.h` that
/// `libmimalloc-sys` 0.1.49 ships, which has no constant for it under v3. Not every option
/// keeps its number (`mi_option_allow_thp` is 37 in v2 and 43 in v3), hence the test.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Applies both settings; called first thing in `main`, before any thread starts.
pub fn settle() {
    keep_freed_memory();
    no_huge_pages();
}

/// Keeps memory that loadgen frees inside the process for reuse instead of handing it
/// back to the kernel; it goes back at exit.
fn keep_freed_memory() {
    // SAFETY: sets a process-wide allocator option; mimalloc documents setting options at
    // any time (the purge delay is read when a purge is scheduled).
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
}

/// Hands freed memory back to the kernel again after mimalloc's default delay (10 ms), for
/// `--chaos`: a soak measures the memory the process holds live, and every restarted or
/// added responder allocates fresh state (a dedup table of several MiB) while the one it
/// replaces frees its own; kept for reuse, the freed state would read as growth.
pub fn purge_freed_memory() {
    // SAFETY: sets a process-wide allocator option, which mimalloc allows at any time
    // (as in `keep_freed_memory`); no pointer is passed.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 10) };
}

/// Returns the memory freed so far to the kernel at once, for `--chaos` after a responder
/// stopped: its state was allocated on the controller's thread (which spawned it) and
/// freed on the responder's own threads, so the pages stay with the controller's heap
/// until that heap collects, and the controller seldom allocates. Measured on a 30 s soak:
/// resident memory after a server stop fell to the footprint of the servers left only
/// with this call.
pub fn release_freed_memory() {
    // SAFETY: mi_collect may be called from any thread at any time; it frees nothing that
    // is in use (it returns empty pages of this thread's heap and purges free ones).
    unsafe { libmimalloc_sys::mi_collect(true) };
}

/// Turns transparent huge pages off for this process (`PR_SET_THP_DISABLE`: the kernel
/// then faults 4 KiB pages even where mimalloc asked for huge ones). A kernel that
/// refuses it (before 3.15) leaves loadgen as it was.
fn no_huge_pages() {
    // SAFETY: prctl with PR_SET_THP_DISABLE takes plain integers and no pointer; it
    // changes only this process's transparent huge page setting.
    unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1 as libc::c_ulong, 0, 0, 0) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freed_memory_is_kept_and_huge_pages_are_off() {
        settle();
        // SAFETY: reads a process-wide allocator option (any time, any thread); no pointer.
        let delay = unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) };
        assert_eq!(delay, -1);
        // SAFETY: PR_GET_THP_DISABLE takes no pointer (its other arguments must be 0).
        let off = unsafe { libc::prctl(libc::PR_GET_THP_DISABLE, 0, 0, 0, 0) };
        assert_eq!(off, 1);
    }
}
