//! outcome (in progress)
