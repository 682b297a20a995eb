//! Runs every loom model of the engine (`ratelimitly_engine::loom_models::MODELS`):
//! `cargo test` here. Cargo.toml says why a crate of its own.

#[cfg(test)]
mod tests {
    use ratelimitly_engine::loom_models::MODELS;
    use std::panic::{AssertUnwindSafe, catch_unwind};

    /// Each model in turn; a model that must fail has to panic with its text. Every
    /// failure is collected, so one run names all of them.
    #[test]
    fn loom_models() {
        let mut failed = Vec::new();
        for m in MODELS {
            let out = catch_unwind(AssertUnwindSafe(m.run));
            match (out, m.must_fail) {
                (Ok(()), None) => {}
                (Ok(()), Some(text)) => {
                    failed.push(format!("{}: passed, but must fail with {text:?}", m.name))
                }
                (Err(p), expected) => {
                    let msg = p
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_default();
                    match expected {
                        Some(text) if msg.contains(text) => {}
                        _ => failed.push(format!("{}: {msg}", m.name)),
                    }
                }
            }
        }
        assert!(
            failed.is_empty(),
            "loom models failed:\n{}",
            failed.join("\n")
        );
        eprintln!("{} loom models checked", MODELS.len());
    }
}
