//! Hostile input and every stated limit: bad requests on every front end,
//! bodies built to amplify memory, the in-flight body budget, connection
//! limits, keys, load shedding, and the fuzzing corpus replayed.

mod amplification;
mod bad_input;
mod body_budget;
mod connections;
mod fuzz_corpus;
mod hostile;
mod security;
mod shedding;
