//! What an operator does and sees: live updates in `poll` mode, the
//! repository API, readiness, graceful shutdown, supervised threads, the
//! compilations counter, metric names, and `tickserve check`.

mod check_command;
mod compilations;
mod lifecycle;
mod metric_names;
mod readiness;
mod repository;
mod shm_supervision;
mod shutdown;
