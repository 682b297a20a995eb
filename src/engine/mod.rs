//! engine (in progress): the glommio thread-per-core driver.

pub mod wheel;
