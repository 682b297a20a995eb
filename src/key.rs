//! key (in progress)
