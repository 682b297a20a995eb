//! README.md shows `examples/embed.rs` verbatim (the example target is what compiles).

#[test]
fn readme_shows_the_embedding_example_verbatim() {
    let readme = include_str!("../README.md");
    let example = include_str!("../examples/embed.rs");
    let block = format!("```rust\n{example}```\n");
    assert!(
        readme.contains(&block),
        "README.md must hold examples/embed.rs verbatim in a ```rust block"
    );
}
