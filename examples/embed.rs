//! Embedding the engine in a Tokio application: one admission decision per request,
//! the engine's core hosted on the application's runtime.
//!
//! `RATELIMITLY_API_KEY=... cargo run --example embed -- 12345@127.0.0.1:7000`
//! (no endpoint: DNS SRV discovery on the key's default domain). README.md shows this
//! file verbatim; `tests/readme.rs` keeps the two in step.

use std::time::Duration;

use ratelimitly_engine::{Decision, Endpoint, Engine, Resource, key_source};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // From RATELIMITLY_API_KEY (or `Some(path)` for a key file), never the command line.
    let key = key_source::load_key(None)?;
    let endpoints = std::env::args()
        .skip(1)
        .map(|arg| arg.parse::<Endpoint>())
        .collect::<Result<Vec<_>, _>>()?;

    let mut builder = Engine::builder(key)
        // Hosted: the core is a task on this runtime (mmsg backend). Leave this line
        // out to run the core on a pinned thread of its own instead.
        .runtime(tokio::runtime::Handle::current());
    if !endpoints.is_empty() {
        builder = builder.endpoints(endpoints); // else DNS discovery
    }
    let engine = builder.build()?;
    let handle = engine.handle(); // Clone + Send + Sync: one per task or thread

    let api = Resource::new("api", Duration::from_secs(1), 100)?;
    match handle.request().consume(&api, 1).send().await {
        Ok(response) if response.decision() == Decision::Granted => println!("granted"),
        Ok(_) => println!("rejected: answer 429"),
        Err(failure) => println!("no decision ({failure}): apply your failure policy"),
    }

    engine.shutdown_graceful().await; // lets submitted requests finish, then stops
    Ok(())
}
