//! The real-data translation study (`cargo run --release --example translate`): its command
//! line ([`config`]), id pairs and their batches, one training run (objective, dev selection,
//! checkpoints, resume), the study's phases ([`study`]), what it reports ([`report`]) and the two
//! in order ([`entry::run_study`]).

pub mod batches;
pub mod config;
pub mod data;
pub mod entry;
pub mod evaluate;
pub mod report;
pub mod run;
pub mod study;
pub mod track;
