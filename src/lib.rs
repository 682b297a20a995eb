//! Ratelimitly engine — see docs/ARCHITECTURE.md (module docs to be completed).

pub mod discovery;
pub mod engine;
pub mod error;
pub mod ids;
pub mod key;
pub mod machine;
pub mod outcome;
pub mod policy;
pub mod wire;
