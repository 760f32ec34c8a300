//! Finite-difference gradient checks against candle's autograd. SKELETON: being written.
