//! ids (in progress)
