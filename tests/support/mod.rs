//! The reference model and the driver that runs the real queue against it,
//! shared by `tests/model.rs` and the fuzz target under `fuzz/`.
#![allow(dead_code)]

pub mod driver;
pub mod model;
pub mod order_model;
