//! What a request can ask for and what a model can be, on every front end
//! that carries it: sequences and windows, Monte Carlo noise, the journal,
//! shadows and canary splits, output guards, the kill switch and breaker,
//! priority levels, keep-warm; replicas as one fleet on etcd.

mod exported_models;
mod fleet;
mod guards;
mod journal;
mod keep_warm;
mod monte_carlo;
mod priorities;
mod risk;
mod sequences;
mod shadow;
mod split;
mod windows;
