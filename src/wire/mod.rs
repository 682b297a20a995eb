//! wire (in progress)
