//! discovery (in progress)
