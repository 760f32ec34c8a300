//! The real-data translation study (`research/examples/translate`): id pairs and their
//! batches, and one training run (objective, dev selection, checkpoints, resume).

pub mod batches;
pub mod data;
pub mod evaluate;
pub mod run;
pub mod track;
