//! The loom models of the lock-free code, listed for the runner in `loom/` (built only
//! with the cargo feature `loom`; not part of the API).
//!
//! Each model lives beside the code it checks (a `loom_models` module in
//! `engine::runtime::completion`, `engine::runtime::submit` and `udp::wake`) and runs
//! that code on loom's types (`src/sync.rs`). They are listed here rather than run as
//! `#[test]`s of this crate because a test build of this crate links its
//! dev-dependencies (criterion, proptest, the responder, ...), which the engine-only
//! feature set of a model build would compile a second time; the runner in `loom/`
//! depends on this crate alone (`loom/Cargo.toml` says more).

use crate::engine::{completion_models as completion, submit_models as submit};
use crate::udp::wake_models as wake;

/// One model: its name, the function that runs it under `loom::model`, and, for a model
/// that shows the checker catches a bug, the text its panic must contain.
#[derive(Debug)]
pub struct Model {
    /// The model's name (its function's).
    pub name: &'static str,
    /// Runs every interleaving within the preemption bound; panics on a violation.
    pub run: fn(),
    /// `Some(text)`: the model must fail with a panic containing `text`.
    pub must_fail: Option<&'static str>,
}

const fn ok(name: &'static str, run: fn()) -> Model {
    Model {
        name,
        run,
        must_fail: None,
    }
}

/// Every model, in the order the runner runs them.
pub const MODELS: &[Model] = &[
    ok(
        "completion_complete_vs_wait",
        completion::loom_completion_complete_vs_wait,
    ),
    ok(
        "completion_deferred_wake_vs_wait",
        completion::loom_completion_deferred_wake_vs_wait,
    ),
    ok(
        "completion_complete_vs_drop",
        completion::loom_completion_complete_vs_drop,
    ),
    ok(
        "completion_deferred_vs_drop",
        completion::loom_completion_deferred_vs_drop,
    ),
    ok(
        "completion_complete_vs_timeout_then_wait",
        completion::loom_completion_complete_vs_timeout_then_wait,
    ),
    ok(
        "completion_complete_vs_timeout_then_drop",
        completion::loom_completion_complete_vs_timeout_then_drop,
    ),
    ok(
        "completion_reuse_vs_late_wake",
        completion::loom_completion_reuse_vs_late_wake,
    ),
    ok(
        "gate_shutdown_vs_submit",
        submit::loom_gate_shutdown_vs_submit,
    ),
    // a shutdown that does not wait for the submitters inside the gate (what happens
    // once the 5 s patience has run out) loses requests: the checker must see it
    Model {
        name: "gate_close_without_waiting_is_caught",
        run: submit::loom_gate_close_without_waiting_is_caught,
        must_fail: Some("accepted but never finished"),
    },
    ok(
        "waker_wake_vs_park_eventfd",
        wake::loom_waker_wake_vs_park_eventfd,
    ),
    ok(
        "waker_two_submitters_vs_hosted_driver",
        wake::loom_waker_two_submitters_vs_hosted_driver,
    ),
];
