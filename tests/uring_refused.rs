//! The engine where io_uring is refused, as under a container runtime's seccomp profile:
//! this test binary (one test, so nothing else shares its process) installs a seccomp
//! filter that answers `io_uring_setup` with EPERM, then builds engines. `Uring` must fail
//! to build with a clear error; `Auto` must fall back to the mmsg backend and serve.
//! (`cargo test -p ratelimitly-engine --test uring_refused`.)

mod engine_common;

use engine_common::*;
use ratelimitly_engine::engine::{Cores, Engine};
use ratelimitly_engine::udp::{BackendChoice, BackendKind};
use rl_responder::Faults;

/// `io_uring_setup` in the generic syscall table (x86-64 and aarch64 alike).
const SYS_IO_URING_SETUP: u32 = 425;

/// Makes `io_uring_setup` fail with EPERM for this thread and the threads it starts.
fn refuse_io_uring() {
    use libc::{
        BPF_ABS, BPF_JEQ, BPF_JMP, BPF_K, BPF_LD, BPF_RET, BPF_W, SECCOMP_RET_ALLOW,
        SECCOMP_RET_ERRNO, sock_filter, sock_fprog,
    };
    let stmt = |code: u32, k: u32| sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    };
    let filter = [
        // A = seccomp_data.nr (offset 0)
        stmt(BPF_LD | BPF_W | BPF_ABS, 0),
        sock_filter {
            code: (BPF_JMP | BPF_JEQ | BPF_K) as u16,
            jt: 0,
            jf: 1,
            k: SYS_IO_URING_SETUP,
        },
        stmt(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | libc::EPERM as u32),
        stmt(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    ];
    let prog = sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_ptr() as *mut sock_filter,
    };
    // SAFETY: plain prctl calls; `prog` points at `filter`, both alive across the call
    // (the kernel copies the program).
    unsafe {
        assert_eq!(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
        assert_eq!(
            libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER,
                &prog as *const sock_fprog,
            ),
            0,
            "seccomp filter: {}",
            std::io::Error::last_os_error()
        );
    }
}

#[test]
fn io_uring_refused_auto_falls_back_to_mmsg_and_serves() {
    let r = responder(AES, 1, Faults::default());
    refuse_io_uring();
    let build = |backend| {
        Engine::builder(key(AES))
            .cores(Cores::Count(1))
            .endpoints(vec![ep(&r)])
            .io_backend(backend)
            .build()
    };
    let err = build(BackendChoice::Uring).expect_err("io_uring is refused");
    assert!(
        err.to_string().to_lowercase().contains("io_uring"),
        "the error names io_uring: {err}"
    );
    let e = build(BackendChoice::Auto).expect("auto falls back to mmsg");
    let h = e.handle();
    grant_batch(&h, "refused", 200);
    assert_eq!(h.stats().io.expect("io stats").backend, BackendKind::Mmsg);
    e.shutdown();
}
